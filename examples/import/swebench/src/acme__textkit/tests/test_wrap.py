from textkit import wrap


def test_wrap_width():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
