"""The [train] section of run.toml: validated at load, errors naming the file and the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from agents.rundir.spec import SpecError, load_spec
from tests.trainer.tinyworld import World
from trainer.paths import load_train_spec, resolve
from trainer.target import TargetError, choose_mask_token, layer_ids


def spec(tmp_path: Path, train: str, kind: str = "train") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nname = "t"\nkind = "{kind}"\ndir = "out"\n{train}')
    return path


@pytest.mark.parametrize(("body", "message"), [
    ("", "[train]: missing"),
    ('[train]\ndata = "d"\ntarget = "t"\nblock_size = 1\n',
     "[train] block_size: must be at least 2"),
    ('[train]\ndata = "d"\ntarget = "t"\ntarget_layer_ids = [3, 1]\n',
     "[train] target_layer_ids: must be distinct, increasing"),
    ('[train]\ndata = "d"\ntarget = "t"\nmax_under_min_share = 2\n',
     "[train] max_under_min_share: must be between 0 and 1"),
    ('[train]\ndata = "d"\ntarget = "t"\nsupervise = "some"\n', "[train] supervise"),
    ('[train]\ndata = "d"\ntarget = "t"\nlr = "fast"\n', "[train] lr"),
    ('[train]\ndata = "d"\ntarget = "t"\nepoch = 3\n', "unknown field `epoch`"),
    ('[train]\ndata = "s3://"\ntarget = "t"\n', "[train] data"),
    ('[train]\ndata = "d"\ntarget = "t"\nloss_chunk = 0\n',
     "[train] loss_chunk: must be at least 1"),
    ('[train]\ndata = "d"\ntarget = "t"\nmax_length = 0\n',
     "[train] max_length: must be at least 1"),
    ('[train]\ndata = "d"\ntarget = "t"\nmax_cut_share = 1.5\n',
     "[train] max_cut_share: must be between 0 and 1"),
    ('[train]\ndata = "d"\ntarget = "t"\ngpu_mem_gib = -80\n',
     "[train] gpu_mem_gib: must be positive"),
])
def test_bad_train_sections_name_the_key(tmp_path: Path, body: str, message: str) -> None:
    path = spec(tmp_path, body)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_paths_resolve_against_the_spec_and_the_run_dir(tmp_path: Path) -> None:
    (tmp_path / "models" / "q").mkdir(parents=True)
    path = spec(tmp_path, '[train]\ndata = "batches"\ntarget = "models/q"\n'
                          'tokenizer = "Qwen/Qwen3-8B"\n')
    s, cfg = load_train_spec(path)
    p = resolve(s, cfg)
    assert p.data == str(tmp_path / "batches") and p.target == str(tmp_path / "models/q")
    assert p.tokenizer == "Qwen/Qwen3-8B", "a hub id stays a hub id"
    assert p.prepared == tmp_path / "out" / "prepared"
    assert p.output == tmp_path / "out" / "checkpoints"
    assert p.progress == tmp_path / "out" / "progress.json"
    assert (cfg.block_size, cfg.lr, cfg.warmup_ratio, cfg.anchors, cfg.clip) == (
        16, 6e-4, 0.04, 512, 1.0)


def test_layer_ids_and_mask_token_checked_against_the_target(random_world: World) -> None:
    # Layer 7 of 8 is refused too: SGLang captures layer i as the input of layer i + 1.
    with pytest.raises(TargetError, match=r"\[train\] target_layer_ids: \[7, 9\] not in "
                                          r"0..6 \(the target has 8"):
        layer_ids(random_world.model, [1, 7, 9], 5)
    assert layer_ids(random_world.model, [0, 6], 5) == [0, 6]
    assert layer_ids(random_world.model, [5, 2], 5) == [2, 5], "sorted: SGLang's order"
    with pytest.raises(TargetError, match="repeats a layer"):
        layer_ids(random_world.model, [2, 2], 5)
    rows = random_world.model.config.vocab_size
    assert choose_mask_token(None, random_world.tokenizer, rows) == len(random_world.tokenizer)
    with pytest.raises(TargetError, match=r"\[train\] mask_token_id"):
        choose_mask_token(rows, random_world.tokenizer, rows)
    with pytest.raises(TargetError, match=r"\[train\] mask_token_id"):
        choose_mask_token(None, random_world.tokenizer, len(random_world.tokenizer))
    # A tokenizer that has <|MASK|> decides; a configured id that differs is refused, as
    # SGLang would refuse the checkpoint.
    tok = copy.deepcopy(random_world.tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|MASK|>"]})
    mapped = tok.convert_tokens_to_ids("<|MASK|>")
    assert choose_mask_token(None, tok, rows) == mapped
    assert choose_mask_token(mapped, tok, rows) == mapped
    with pytest.raises(TargetError, match=rf"maps <\|MASK\|> to {mapped}"):
        choose_mask_token(mapped + 1, tok, rows)


def test_anchor_rule_key_defaults_to_supervised_next_and_is_checked_at_load(
        tmp_path: Path) -> None:
    from trainer.train import anchor_rule

    _, cfg = load_train_spec(spec(tmp_path, '[train]\ndata = "d"\ntarget = "t"\n'))
    assert anchor_rule(cfg) == "supervised_next"
    _, old = load_train_spec(spec(tmp_path, '[train]\ndata = "d"\ntarget = "t"\n'
                                            'anchor_rule = "whole_block"\n'))
    assert anchor_rule(old) == "whole_block"
    with pytest.raises(SpecError, match="anchor_rule"):
        load_spec(spec(tmp_path, '[train]\ndata = "d"\ntarget = "t"\nanchor_rule = "late"\n'))
