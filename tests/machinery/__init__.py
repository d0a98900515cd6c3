"""What the tests (and the benchmarks that borrow them) stand on, kept out of the shipped packages:
the network-namespace test hosts (`machinery.netns`). Imported as `machinery` from tests/, which pytest
puts on sys.path with tests/conftest.py (as it does for tests/dist_cases.py); a script elsewhere adds
tests/ to sys.path itself (bench/staging_bench.py)."""
