"""Messages on stderr, so stdout stays clean for `--json` output."""
import click


def info(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)
