"""Markdown tables, shared by the accuracy report and the cost profiles' summary."""


def table_lines(header, rows):
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return lines
