def add(a, b):
    """Return a + b."""
    return a - b


def mul(a, b):
    """Return a * b."""
    return a * b
