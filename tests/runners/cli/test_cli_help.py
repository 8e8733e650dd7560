"""`loopnas -h` works and lists each command by one sentence (issue #33)."""
from runners.cli import app, first_sentence, main


def test_dash_h_is_help(capsys):
    assert main(["-h"]) == 0
    assert "Commands" in capsys.readouterr().out


def test_each_command_is_listed_by_one_sentence():
    for command in app.registered_commands:
        text = command.short_help
        assert text and text.endswith(".") and ". " not in text and "\n" not in text, command.name


def test_first_sentence():
    assert first_sentence("Train a proxy\n    of SPEC. With --out, more.\n\n    Examples") == "Train a proxy of SPEC."
    assert first_sentence("No full stop here") == "No full stop here"


def test_task_help_lists_every_registered_task(capsys):
    """--task's help is drawn from the tasks nas.proxy knows, which are the registered ones."""
    from runners.tasks import task_names

    assert main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    listed = out.split("Proxy task: ", 1)[1].split(".", 1)[0]
    assert sorted(listed.split(", ")) == sorted(task_names())
