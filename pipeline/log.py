"""Messages on stderr, so stdout stays clean for `--json` output."""
import click


def info(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def progress(desc: str, total: int | None, quiet: bool, initial: int = 0):
    """A tqdm bar, frames as the unit: a widget in Jupyter, text on stderr elsewhere (tqdm's
    auto mode). Use it as a context manager: it is then closed (ending its line) also when
    the stage stops with an error."""
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="frame", desc=desc, disable=quiet,
                dynamic_ncols=True, mininterval=0.5)
