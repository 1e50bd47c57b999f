"""Messages on stderr, so stdout stays clean for `--json` output."""
import click


def info(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def progress(desc: str, total: int | None, quiet: bool, initial: int = 0):
    """A tqdm bar on stderr, frames as the unit. Use it as a context manager: it is then
    closed (ending its line) also when the stage stops with an error."""
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="frame", desc=desc, disable=quiet,
                dynamic_ncols=True, mininterval=0.5)
