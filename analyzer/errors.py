"""The one exception type the user sees. The CLI prints its message as one line, exit 2."""


class GraphcostError(Exception):
    """Bad input or an analysis that cannot proceed; the message says what and how to fix it."""
