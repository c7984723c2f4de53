from intervals import merge


def test_overlapping():
    assert merge([[1, 3], [2, 5]]) == [[1, 5]]


def test_disjoint():
    assert merge([[4, 5], [1, 2]]) == [[1, 2], [4, 5]]
