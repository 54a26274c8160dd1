"""User-facing errors.

Anything raised as :class:`UserError` is printed by the CLI as a single line
(``esreason: error: ...``) with exit status 2 and no traceback. Raise it for bad
input (config keys, files, rows, values); let genuine bugs raise normally.
"""


class UserError(Exception):
    """A problem with the user's input: message names the key, file, row or value."""
