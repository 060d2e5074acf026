"""The memory plan: its parameter counts are the models' own, its peak is torch's measured
peak on the CPU within 15%, and `plan` and `train` say whether a run fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.trainer.conftest import cli
from tests.trainer.peakmem import peak_bytes
from tests.trainer.tinyworld import World, word_lines, write_batches, write_spec
from trainer.blocks import Anchors, position_weights
from trainer.contract import DFlashSettings, drafter_config
from trainer.drafter import DFlashDraftModel
from trainer.memplan import GIB, MemoryPlanError, PlanInputs, TargetShape, plan
from trainer.objective import Batch, block_loss
from trainer.target import features, load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BIG = FIXTURES / "targets" / "qwen36-27b-like"


def test_parameter_counts_are_the_models_own(random_world: World) -> None:
    shape = TargetShape.read(random_world.target)
    lean = load_target(str(random_world.target), torch.float32, torch.device("cpu"),
                       keep_layers=4)
    assert shape.target_params(4) == sum(p.numel() for p in lean.parameters())
    settings = DFlashSettings(16, shape.vocab - 1, [1, 2, 3])
    drafter = DFlashDraftModel(drafter_config(lean.config, 2, settings))
    assert shape.drafter_params(2, 3) == sum(p.numel() for p in drafter.parameters())


def _measured_step(tmp: Path, hidden: int, inter: int, vocab: int, b: int, seq: int,
                   anchors: int, layers: int, chunk: int) -> tuple[int, PlanInputs]:
    """Torch's peak of live tensor bytes over two fp32 training steps on the CPU (the lean
    target's weights are mapped from their file, not allocated: their own bytes are added),
    and the plan's inputs for the same step."""
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(tmp)
    ids_l, block = [1, 2, 3], 16
    target = load_target(str(tmp), torch.float32, torch.device("cpu"), keep_layers=4)
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    gen = torch.Generator().manual_seed(1)
    with peak_bytes() as peak:
        ids = torch.randint(0, vocab, (b, seq), generator=gen)
        batch = Batch(ids, torch.ones(b, seq, dtype=torch.bool), torch.ones_like(ids),
                      torch.full((b,), seq))
        pos = torch.stack([torch.randperm(seq - block, generator=gen)[:anchors].sort().values
                           for _ in range(b)])
        drafter = DFlashDraftModel(drafter_config(cfg, layers, DFlashSettings(
            block, vocab - 1, ids_l))).float()
        opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
        for _ in range(2):
            feats = features(target, ids, batch.attention_mask, ids_l)
            loss, _ = block_loss(drafter, target.get_input_embeddings(),
                                 target.get_output_embeddings(), feats, batch,
                                 Anchors(pos, torch.ones(b, anchors, dtype=torch.bool)),
                                 vocab - 1, position_weights(block, 7.0), "sdpa", chunk)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del feats, loss
    shape = TargetShape.of(cfg.to_dict())
    inputs = PlanInputs(shape, ids_l, layers, b, seq, anchors, block, chunk, bf16=False)
    return peak.bytes + weights, inputs


@pytest.mark.parametrize("size", [
    # hidden, intermediate, vocab, batch, length, anchors, drafter layers, loss chunk
    (256, 768, 8192, 2, 256, 16, 2, 256),
    (128, 512, 16384, 1, 512, 24, 3, 128),
    (384, 1024, 4096, 3, 192, 8, 1, 512),
])
def test_the_plans_peak_is_the_measured_peak_within_15_percent(
        tmp_path: Path, size: tuple[int, ...]) -> None:
    measured, inputs = _measured_step(tmp_path, *size)
    planned = plan(inputs).peak
    assert abs(planned - measured) <= 0.15 * measured, (
        f"plan {planned / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")


def _big_inputs(**over: object) -> PlanInputs:
    base = dict(shape=TargetShape.read(BIG), feature_layers=[1, 16, 31, 46, 61],
                drafter_layers=5, batch=4, seq=3072, anchors=512, block=16, loss_chunk=1024,
                world=4, capacity=96 * GIB)
    base.update(over)
    return PlanInputs(**base)  # type: ignore[arg-type]


def test_the_reference_setup_and_when_only_sharding_fits() -> None:
    """A ~27B target on 4 x 96 GB: batch 4 does not fit (the drafter's activations), batch 1
    (with grad_accum 4) does; the lean target keeps 62 of its 64 layers."""
    assert plan(_big_inputs()).fits is False
    p = plan(_big_inputs(batch=1))
    table = p.table()
    assert p.fits is True and "62 of 64 layers" in table and "fits: " in table
    # Tighter memory: replicated no longer fits, sharded over the 4 ranks it does.
    replicated = plan(_big_inputs(batch=1, capacity=p.peak))
    assert replicated.fits is False and replicated.needs_sharding
    assert "sharded over the ranks (FSDP) it does" in replicated.table()
    sharded = plan(_big_inputs(batch=1, capacity=p.peak, sharded=True))
    assert sharded.fits is True and sharded.peak < p.peak
    # One rank: nothing to shard over.
    alone = plan(_big_inputs(batch=1, world=1, capacity=p.peak // 2))
    assert alone.fits is False and not alone.needs_sharding


def test_a_config_without_a_key_is_named(tmp_path: Path) -> None:
    raw = json.loads((BIG / "config.json").read_text())
    del raw["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(MemoryPlanError, match=r"config.json: intermediate_size: None"):
        TargetShape.read(tmp_path)


def test_plan_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path / "run.toml", str(tmp_path / "data"), BIG, tmp_path / "run",
                      dtype="auto", batch_size=1, grad_accum=4, anchors=512, drafter_layers=5,
                      nproc=4)
    r = cli(capsys, "plan", str(spec), "--gpu-mem", "96")
    assert r.returncode == 0, r.stderr
    assert "4 rank(s), replicated" in r.stdout and "fits:" in r.stdout
    assert "batch 1 x 3072 tokens (max_length)" in r.stdout
    r = cli(capsys, "plan", str(spec), "--gpu-mem", "80")
    assert r.returncode == 1 and "does NOT fit" in r.stdout
    assert "sharded over the ranks (FSDP) it does" in r.stdout
    r = cli(capsys, "plan", str(spec), "--gpu-mem", "80", "--sharded")
    assert r.returncode == 0 and "sharded (FSDP)" in r.stdout
    r = cli(capsys, "plan", str(spec), "--gpu-mem", "96", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["fits"] is True
    if not torch.cuda.is_available():
        r = cli(capsys, "plan", str(spec))
        assert r.returncode == 2 and "--gpu-mem" in r.stderr


def test_train_refuses_a_run_that_does_not_fit_unless_allowed(
        tmp_path: Path, random_world: World, capsys: pytest.CaptureFixture[str]) -> None:
    write_batches(tmp_path / "data", word_lines(40))
    spec = write_spec(tmp_path / "run.toml", str(tmp_path / "data"), random_world.target,
                      tmp_path / "run", gpu_mem_gib=1.0, max_steps=1, batch_size=2)
    assert cli(capsys, "prepare", str(spec)).returncode == 0
    r = cli(capsys, "train", str(spec))
    assert r.returncode == 1, r.stderr
    assert "does not fit the GPU's memory" in r.stderr and "peak" in r.stderr
    assert "--allow-unfit" in r.stderr
    # The plan used prepare's longest sample, not max_length.
    assert "(prepare's longest sample)" in r.stderr
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["status"] == "failed" and "does not fit" in progress["message"]
    (tmp_path / "run" / "progress.json").unlink()
    r = cli(capsys, "train", str(spec), "--allow-unfit")
    assert r.returncode == 0, r.stderr
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["status"] == "done" and progress["step"] == 1
