def merge(intervals):
    """Merge overlapping closed intervals [a, b]; intervals that touch (b == c) merge too."""
    out = []
    for a, b in sorted(intervals):
        if out and a < out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
