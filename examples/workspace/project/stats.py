def mean(xs):
    """The arithmetic mean of xs."""
    return sum(xs) // len(xs)


def spread(xs):
    return max(xs) - min(xs)
