def slugify(title):
    """A URL slug of title: lower-case words of letters and digits joined by dashes."""
    return "-".join(title.split())
