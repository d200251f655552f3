"""`gpuplatform submit --image REF [--image-pull-secret NAME]` (docs/images.md): the body's
`image` and `image_pull_secret`; without a command the image's own Cmd runs (no `command`)."""

from tests.cli.test_client_unit import api, run, submitted  # noqa: F401 (the fixture)

IMAGE = "registry.example.com/team/train:v1"


def test_submit_with_an_image_and_a_command(api, capsys):  # noqa: F811
    code = run("submit", "--image", IMAGE, "--image-pull-secret", "REG", "--gpus", "1", "--",
               "python", "train.py")  # fmt: skip
    assert code == 0
    assert submitted(api) == {"command": ["python", "train.py"], "image": IMAGE, "name": "train",
                              "image_pull_secret": "REG", "gpus": 1}  # fmt: skip


def test_submit_an_image_alone_runs_its_cmd(api, capsys):  # noqa: F811
    assert run("submit", "--image", IMAGE) == 0
    assert submitted(api) == {"image": IMAGE}


def test_without_command_template_or_image_it_still_says_what_it_wants(api, capsys):  # noqa: F811
    assert run("submit", "--gpus", "1") != 0
    assert "--image REF" in capsys.readouterr().err
