import typer

app = typer.Typer(help="ppo (under construction)", no_args_is_help=True, add_completion=False)


@app.callback()
def _main() -> None:
    """ppo."""
