"""User-facing errors: one clear message naming the file, line or key; never a traceback."""


class BertJaxError(Exception):
    """A mistake in user input (path, config key, data row, checkpoint) with a clear message.

    The CLI prints ``error: <message>`` and exits with status 2 instead of a traceback.
    """
