"""SSH keys at the two ends of the first log-in: the operator's public key that the stack installs on
every host, and the hosts' own keys that `orchestrate up` pins from what each instance printed on its
console at first boot.

Why the console: the cloud cannot vouch for a host key in its API, but cloud-init prints the keys it
generated between `-----BEGIN SSH HOST KEY KEYS-----` and `-----END SSH HOST KEY KEYS-----` on the
instance's serial console, which only the account's credentials can read (`ec2:GetConsoleOutput`).
Pinning those keys keeps trust-on-first-use off without anyone copying keys by hand.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from pathlib import Path

from evidence.errors import UserError

PUBLIC_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
"""Host-key types in the order they are pinned: ed25519 first."""

BEGIN, END = "-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"
_KEY = re.compile(r"(?:^|\s)(" + "|".join(map(re.escape, PUBLIC_TYPES)) + r") ([A-Za-z0-9+/]+={0,3})(?=\s|$)")


class SSHKeyError(UserError, ValueError):
    """A key that cannot be used as given; the message names what it is and what to give instead."""


def check_public_key(line: str) -> str:
    """`type base64` of one OpenSSH public key, checked: the blob decodes, names the same type, and
    paramiko can load it. A comment is dropped; anything else is refused with what it looks like."""
    text = line.strip()
    if "PRIVATE KEY" in text:
        raise SSHKeyError("that is a private key: give the public half (the .pub file, or its one line of text); "
                        "a private key never goes into a stack")
    parts = text.split()
    if len(parts) < 2 or parts[0] not in PUBLIC_TYPES:
        raise SSHKeyError(f"not an OpenSSH public key (expected one line '<type> <base64> [comment]' with type one of "
                        f"{', '.join(PUBLIC_TYPES)}): {text[:40]!r}")
    kind, blob = parts[0], parts[1]
    try:
        raw = base64.b64decode(blob, validate=True)
        (n,) = struct.unpack(">I", raw[:4])
        inner = raw[4:4 + n].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError) as e:
        raise SSHKeyError(f"the {kind} key's base64 part is damaged ({e})") from None
    if inner != kind:
        raise SSHKeyError(f"the key says {kind} but its data is a {inner!r} key")
    # start-up: paramiko (with cryptography) takes ~0.1 s to import; every `orchestrate` command imports this
    # module (through the plan and the cloud reads), and only a key being checked needs it
    import paramiko

    try:
        key = paramiko.PKey.from_type_string(kind, raw)
    except Exception as e:  # paramiko raises several types for a malformed blob
        raise SSHKeyError(f"the {kind} key does not load: {e}") from None
    if key.asbytes() != raw:  # a cut blob loads (missing bytes read as zeros) but is not the key
        raise SSHKeyError(f"the {kind} key is cut short or has bytes to spare: its data is not one whole key")
    return f"{kind} {blob}"


OPERATOR_TYPES = ("ssh-ed25519", "ssh-rsa")
"""What EC2 imports as a key pair."""


def operator_public_key(value: str) -> str:
    """The stack's `ssh_public_key`: the key's text, or a path to it (`~` allowed). A path to a
    private key is refused naming the .pub beside it; a file's contents are never echoed."""
    text = value.strip()
    if not text.startswith(PUBLIC_TYPES) and "PRIVATE KEY" not in text and "\n" not in text \
            and not re.match(r"^[\w-]+=|^[\w-]+,", text):
        path = Path(text).expanduser()
        if not path.is_file():
            raise SSHKeyError(f"ssh_public_key {text[:80]!r} is neither an OpenSSH public key nor a file")
        body = path.read_text(errors="replace")
        if "PRIVATE KEY" in body:
            raise SSHKeyError(f"{path} is a private key: give its public half ({path}.pub)")
        try:
            text = check_public_key(body)
        except SSHKeyError as e:
            raise SSHKeyError(f"{path}: {str(e).split(':', 1)[0]}") from None
    elif re.match(r"^[\w-]+(=|,)", text):
        raise SSHKeyError("that key line starts with options (from=, no-pty, …), as in authorized_keys: give the "
                          "key alone, '<type> <base64> [comment]'")
    key = check_public_key(text)
    if not key.startswith(OPERATOR_TYPES):
        raise SSHKeyError(f"EC2 key pairs are ed25519 or RSA; this is {key.split()[0]}: give an ed25519 key "
                          "(ssh-keygen -t ed25519)")
    return key


def host_key_blocks(console: str) -> list[dict[str, str]]:
    """Every complete host-key block in a console text, oldest first, each as {type: 'type base64'}.
    Lines may carry a prefix (`ec2: `, a timestamp); a block cut off by the end of the text (a boot
    still printing) does not count."""
    blocks, current = [], None
    for line in console.splitlines():
        if BEGIN in line:
            current = {}
        elif END in line and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            m = _KEY.search(line)
            if m:
                current[m[1]] = check_public_key(f"{m[1]} {m[2]}")
    return blocks


def pinned_host_key(console: str, where: str) -> str | None:
    """The key to pin from an instance's console (ed25519 first), or None while it has printed none.
    Blocks from several boots must agree: a host whose key changed is refused, never re-trusted."""
    blocks = [b for b in host_key_blocks(console) if b]
    if not blocks:
        return None
    for kind in PUBLIC_TYPES:
        seen = {b[kind] for b in blocks if kind in b}
        if len(seen) > 1:
            raise SSHKeyError(f"{where} printed {len(seen)} different {kind} host keys across boots: refusing to pin "
                            "either (a replaced host, or someone else's console text)")
        if seen:
            return seen.pop()
    return None
