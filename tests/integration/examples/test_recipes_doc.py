"""docs/integration.md's verl and slime recipes name the functions the current frameworks have, say what is
untested, and keep their code out of the shell blocks the quick-start test runs."""

from __future__ import annotations

from tests.doc_blocks import ROOT, bash_blocks

PAGE = ROOT / "docs" / "integration.md"


def recipes() -> str:
    text = PAGE.read_text()
    return text[text.index("## 6. Recipes: verl and slime"):]


def test_the_recipes_replace_the_current_functions() -> None:
    section = recipes()
    for name in ("train_mini_batch", "RayPPOTrainer.fit", "forward_backward_batch", "ppo_loss",  # verl
                 "_convert_samples_to_train_data", "_split_train_data_by_dp", "train_actor", "get_data_iterator"):
        assert f"`{name}" in section or f"{name}`" in section, name
    # update_policy is named only as the legacy path earlier versions of the page named.
    assert PAGE.read_text().count("update_policy") == 1 and "legacy" in section


def test_the_recipes_say_what_is_untested_and_run_nothing() -> None:
    section = recipes()
    assert section.count("ntested") >= 4
    assert "AttachFields" in section and "roles feature" in section
    assert "```bash" not in section  # every bash block of this page runs in the quick-start test
    quick_start = PAGE.read_text().split("## 1. Deploy the services")[0]
    assert len(bash_blocks(PAGE)) == quick_start.count("```bash")  # all of them are the quick start's
