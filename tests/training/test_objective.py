"""The weighted response objective against Hugging Face's own masked loss, position by position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dist_cases import synthetic_corpus
from training.objective import (WeightedResponseLoss, collate, collate_packed, collate_rows, group_rows,
                                make_microbatches)

SPECS = [(14, 5, 8), (9, 3, 1), (20, 12, 8), (9, 8, 1)]  # (length, prompt, weight); last: 1 target


def test_collate_targets_are_exactly_the_response_tokens():
    corpus = synthetic_corpus(SPECS, 3)
    mb = collate(corpus, [0, 1, 2, 3], pad_id=2)
    assert mb.input_ids.shape == (4, 20) and mb.attention_mask is not None
    # the token predicted at (row, col) is the one at col + 1, and it is a target label
    assert torch.equal(mb.input_ids[mb.rows, mb.cols + 1], mb.labels)
    for r, (n, p, w) in enumerate(SPECS):
        sel = mb.rows == r
        cols = mb.cols[sel]
        assert cols.tolist() == list(range(p - 1, n - 1))  # never a prompt token, never padding
        assert mb.labels[sel].tolist() == corpus.doc(r)[p:].tolist()
        assert set(mb.weights[sel].tolist()) == {float(w)}
        assert mb.attention_mask[r].sum() == n
    assert mb.weighted_targets == sum(w * (n - p) for n, p, w in SPECS)


def test_no_padding_means_no_mask():
    corpus = synthetic_corpus([(10, 4, 1), (10, 2, 8)], 4)
    assert collate(corpus, [0, 1], pad_id=2).attention_mask is None


def test_document_without_targets_is_refused():
    corpus = synthetic_corpus([(6, 6, 1)], 5)
    with pytest.raises(ValueError, match="no target tokens"):
        collate(corpus, [0], pad_id=2)


def test_microbatches_sort_longest_first_and_keep_a_partial_last():
    corpus = synthetic_corpus([(9, 2, 1), (30, 2, 1), (9, 2, 1), (15, 2, 1), (30, 2, 1)], 6)
    mbs = make_microbatches(corpus, [0, 1, 2, 3, 4], 2, pad_id=2)
    assert [m.docs for m in mbs] == [[1, 4], [3, 0], [2]]  # ties keep their assignment order
    unsorted = make_microbatches(corpus, [0, 1, 2, 3, 4], 2, pad_id=2, sort_by_length=False)
    assert [m.docs for m in unsorted] == [[0, 1], [2, 3], [4]]
    assert [len(m.docs) for m in make_microbatches(corpus, [0, 1, 2], None, pad_id=2)] == [3]


def test_weighted_loss_equals_hugging_face_masked_loss(tiny_seed):
    """Σ_d w_d · Σ_targets CE, from a padded batch, equals HF's per-document mean loss with
    prompt labels = -100, times each document's target count and weight."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32).eval()
    corpus = synthetic_corpus(SPECS, 3)
    mb = collate(corpus, [0, 1, 2, 3], pad_id=2)
    with torch.no_grad():
        got = float(WeightedResponseLoss(model)(*mb.args()))
        want = 0.0
        for d, (n, p, w) in enumerate(SPECS):
            ids = torch.from_numpy(corpus.doc(d).astype(np.int64))[None]
            labels = ids.clone()
            labels[0, :p] = -100
            want += w * (n - p) * float(model(input_ids=ids, labels=labels).loss)
    assert got == pytest.approx(want, rel=1e-5)
    # and the weights matter: the same batch with weight 1 everywhere differs
    with torch.no_grad():
        flat = float(WeightedResponseLoss(model)(mb.input_ids, mb.attention_mask, mb.rows, mb.cols,
                                                 mb.labels, torch.ones_like(mb.weights)))
    assert abs(flat - got) > 0.1 * got


def test_packed_row_holds_every_document_once_with_restarting_positions():
    corpus = synthetic_corpus(SPECS, 3)
    mb = collate_packed(corpus, [0, 1, 2, 3], pad_id=2, pad_multiple=16)
    n_real = sum(n for n, _, _ in SPECS)
    assert mb.input_ids.shape == (1, 64) and mb.attention_mask is None  # 52 tokens, rounded up to 64
    starts = np.cumsum([0] + [n for n, _, _ in SPECS])
    for d, (n, p, w) in enumerate(SPECS):
        a = int(starts[d])
        assert mb.input_ids[0, a:a + n].tolist() == corpus.doc(d).tolist()
        assert mb.position_ids[0, a:a + n].tolist() == list(range(n))
    assert mb.position_ids[0, n_real:].tolist() == list(range(64 - n_real))  # the tail: its own sequence
    assert (mb.input_ids[0, n_real:] == 2).all()
    assert torch.equal(mb.input_ids[mb.rows, mb.cols + 1], mb.labels)
    padded = collate(corpus, [0, 1, 2, 3], pad_id=2)
    assert torch.equal(mb.labels, padded.labels) and torch.equal(mb.weights, padded.weights)
    assert mb.weighted_targets == padded.weighted_targets
    assert int(mb.cols.max()) < n_real - 1  # no target is predicted from the tail


def test_packed_loss_and_gradients_equal_the_padded_ones(tiny_seed):
    """Packing changes only where the tokens sit: Hugging Face's mask keeps each document's attention
    inside itself, so the sum and every gradient match the padded batch. Without restarting
    positions the documents would see each other, and the loss moves (the check can fail)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32)
    loss = WeightedResponseLoss(model)
    corpus = synthetic_corpus(SPECS, 3)
    padded = collate(corpus, [0, 1, 2, 3], pad_id=2)
    packed = collate_packed(corpus, [0, 1, 2, 3], pad_id=2, pad_multiple=16)

    def run(mb):
        model.zero_grad(set_to_none=True)
        out = loss(*mb.args())
        out.backward()
        return float(out.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}

    want, g_want = run(padded)
    got, g_got = run(packed)
    rel = 1e-5
    assert got == pytest.approx(want, rel=rel)
    for name, g in g_want.items():
        torch.testing.assert_close(g_got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    seeing = collate_packed(corpus, [0, 1, 2, 3], pad_id=2)
    seeing.position_ids = torch.arange(seeing.input_ids.shape[1])[None]  # one long sequence
    with torch.no_grad():  # the control moves the loss by far more than the equality above allows
        assert abs(float(loss(*seeing.args())) - want) > 20 * rel * want


def test_fixed_width_rows_are_filled_first_fit_and_hold_every_document_once():
    """`pack_tokens`: every row has exactly that width (one compiled shape); documents go to the
    first row with room, in assignment order; a document wider than a row is refused."""
    specs = [(14, 5, 8), (9, 3, 1), (20, 12, 8), (9, 8, 1), (6, 2, 1), (15, 4, 1)]
    corpus = synthetic_corpus(specs, 3)
    mbs = make_microbatches(corpus, [5, 0, 1, 2, 3, 4], 2, pad_id=2, pack=True, pack_tokens=24)
    # 15 → row 0; 14 → row 1; 9 → row 0 (24); 20 → row 2; 9 → row 1 (23); 6 → row 3
    assert [mb.docs for mb in mbs] == [[5, 1], [0, 3], [2], [4]]
    assert all(mb.input_ids.shape == (1, 24) for mb in mbs)
    for mb in mbs:
        assert torch.equal(mb.input_ids[mb.rows, mb.cols + 1], mb.labels)
        want = collate_packed(corpus, mb.docs, pad_id=2)
        n = want.input_ids.shape[1]
        assert torch.equal(mb.input_ids[:, :n], want.input_ids) and torch.equal(mb.labels, want.labels)
    assert sum(mb.weighted_targets for mb in mbs) == sum(w * (n - p) for n, p, w in specs)
    with pytest.raises(ValueError, match="more than a packed row's 18"):
        make_microbatches(corpus, [0, 2], None, pad_id=2, pack=True, pack_tokens=18)


def test_rows_per_forward_group_in_order_and_leave_the_remainder_one_by_one():
    """`pack_rows`: full groups of that many first-fit rows, then each remaining row alone (two
    shapes under compile); the same documents in the same order, each row as `collate_rows` lays it."""
    specs = [(14, 5, 8), (9, 3, 1), (20, 12, 8), (9, 8, 1), (6, 2, 1), (15, 4, 1), (19, 3, 8)]
    corpus = synthetic_corpus(specs, 3)
    docs = [5, 0, 1, 2, 3, 4, 6]  # rows [5, 1], [0, 3], [2], [4], [6]
    one = make_microbatches(corpus, docs, None, pad_id=2, pack=True, pack_tokens=24)
    rows = [mb.docs for mb in one]
    assert len(rows) == 5
    got = make_microbatches(corpus, docs, None, pad_id=2, pack=True, pack_tokens=24, pack_rows=2)
    assert [mb.input_ids.shape for mb in got] == [(2, 24), (2, 24), (1, 24)]
    assert [mb.docs for mb in got] == [rows[0] + rows[1], rows[2] + rows[3], rows[4]]
    for mb, group in zip(got, group_rows(rows, 2)):
        want = [one[rows.index(r)] for r in group]
        assert torch.equal(mb.input_ids, torch.cat([w.input_ids for w in want]))
        assert torch.equal(mb.position_ids, torch.cat([w.position_ids for w in want]))
        assert torch.equal(mb.input_ids[mb.rows, mb.cols + 1], mb.labels)
        assert mb.rows.tolist() == [i for i, w in enumerate(want) for _ in range(len(w.labels))]
        assert mb.weighted_targets == sum(w.weighted_targets for w in want)
    assert group_rows(rows, 5) == [rows] and group_rows(rows, 1) == [[r] for r in rows]
    with pytest.raises(ValueError, match="at least 1"):
        group_rows(rows, 0)
    with pytest.raises(ValueError, match="more than a row's 20"):
        collate_rows(corpus, [[5, 1]], pad_id=2, width=20)


def test_rows_in_one_forward_give_the_one_row_loss_and_gradients(tiny_seed):
    """Stacking packed rows changes only the batch dimension: no attention crosses a row, so the
    sum and every gradient equal those of the rows run one by one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32)
    loss = WeightedResponseLoss(model)
    specs = [(14, 5, 8), (9, 3, 1), (20, 12, 8), (9, 8, 1), (6, 2, 1), (15, 4, 1)]
    corpus = synthetic_corpus(specs, 3)
    one = make_microbatches(corpus, range(6), None, pad_id=2, pack=True, pack_tokens=24)
    [stacked] = make_microbatches(corpus, range(6), None, pad_id=2, pack=True, pack_tokens=24,
                                  pack_rows=len(one))

    def run(mbs):
        model.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs:
            out = loss(*mb.args())
            out.backward()
            total += float(out.detach())
        return total, {n: p.grad.clone() for n, p in model.named_parameters()}

    want, g_want = run(one)
    got, g_got = run([stacked])
    assert got == pytest.approx(want, rel=1e-5)
    for name, g in g_want.items():  # the embedding's scatter-add sums 4 rows' tokens in another
        # order: up to 3.8e-5 on elements of 0.12, so the bound is relative to the tensor's scale
        torch.testing.assert_close(g_got[name], g, rtol=1e-4, atol=1e-4 * float(g.abs().max()), msg=name)
    seeing = make_microbatches(corpus, range(6), None, pad_id=2, pack=True, pack_tokens=24, pack_rows=4)[0]
    seeing.position_ids = torch.arange(24).repeat(len(one), 1)  # each row one long sequence
    with torch.no_grad():  # two rows of two documents seeing each other: 2.5e-4 of the sum (the
        # rows' reordering above: 3e-8)
        assert abs(float(loss(*seeing.args())) - want) > 1e-4 * want


def test_pack_tokens_needs_pack_and_room_for_the_longest_document():
    from training.config import lineage

    prof = lineage("batched-learning", "gpu-bench-packed")[-1].profile
    assert prof.pack and prof.pack_tokens and prof.pack_tokens >= prof.max_context
    base = prof.model_dump()
    for bad in ({"pack": False, "compile": True}, {"pack_tokens": prof.max_context - 1}):
        with pytest.raises(ValueError, match="pack_tokens needs pack = true"):
            type(prof).model_validate({**base, **bad})

    with pytest.raises(ValueError, match="pack_rows needs pack_tokens"):
        type(prof).model_validate({**base, "pack_tokens": None, "pack_rows": 2})
    with pytest.raises(ValueError, match="pack_rows needs pack_tokens"):
        type(prof).model_validate({**base, "pack_rows": 0})
    assert type(prof).model_validate({**base, "pack_rows": 8}).pack_rows == 8
