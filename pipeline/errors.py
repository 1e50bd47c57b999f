import click


class UserError(click.ClickException):
    """A problem with the user's input: printed as one line, exit code 1, no traceback."""
