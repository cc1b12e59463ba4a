"""The bounded memo table behind the hot paths' caches."""

from gpuremote.memo import Memo


def test_memo_remembers_until_full_then_starts_over():
    memo = Memo(3)
    assert memo.put("a", 1) == 1 and memo.get("a") == 1
    memo.put("b", 2)
    memo.put("c", 3)
    assert len(memo) == 3
    memo.put("d", 4)                     # full: everything else is forgotten
    assert dict(memo) == {"d": 4}
    memo.put("d", 5)                     # a key already there is replaced, not counted again
    assert dict(memo) == {"d": 5}


def test_memo_never_grows_past_its_limit():
    memo = Memo(100)
    for i in range(10_000):
        memo.put(i, i)
        assert len(memo) <= 100
