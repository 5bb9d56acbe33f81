"""progress.py: progress lines without a terminal."""





def test_progress_prints_lines_where_rich_draws_no_bars():
    """On a pipe or log file rich shows nothing until the end; a run killed early must still say how far it got."""
    import io

    from rich.console import Console

    from musacoder.progress import LoggedProgress

    log = io.StringIO()
    with LoggedProgress(console=Console(file=log, force_terminal=False, width=100), every=3600) as bar:
        job = bar.add_task("generate", total=3)
        for _ in range(3):
            bar.advance(job)
        bar.update(job, total=5)  # a bar whose total grows prints again when it completes again
        bar.update(job, completed=5)
    lines = [ln for ln in log.getvalue().splitlines() if ln.startswith("generate:")]
    assert [ln.split(" (")[0] for ln in lines][:3] == ["generate: 1/3", "generate: 3/3", "generate: 5/5"]
    tty = io.StringIO()
    with LoggedProgress(console=Console(file=tty, force_terminal=True, width=100), transient=True) as bar:
        bar.advance(bar.add_task("generate", total=1))
    assert "generate: 1/1" not in tty.getvalue()
