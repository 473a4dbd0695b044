"""Pipeline layer split, schedule rules and the dry run of every seed layout. No processes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainbench import planning
from trainbench import plan as planmod
from trainbench.catalog import recipes
from trainbench.cli import app
from trainbench.layout import rank_coordinates, rank_stages, stage_layers


def megatron_layers(num_layers: int, pp: int, vp: int, pp_rank: int, vp_rank: int) -> range:
    """The layers Megatron-Core builds on one virtual stage with
    account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split
    (NeMo's setting for Llama 3.1 405B), written out from its rules:
    - the embedding and the loss each count as one layer: L + 2 over PP*VP stages;
    - the first offset of chunk vp_rank on rank pp_rank is
      vp_rank * (L+2)/VP + pp_rank * (L+2)/(PP*VP), minus one (the embedding) on every
      stage but the very first;
    - the very first and the very last virtual stage build one layer fewer.
    """
    total = num_layers + 2
    per_stage = total // (pp * vp)
    first = pp_rank == 0 and vp_rank == 0
    last = pp_rank == pp - 1 and vp_rank == vp - 1
    offset = vp_rank * (total // vp) + pp_rank * per_stage - (0 if first else 1)
    count = per_stage - first - last
    return range(offset, offset + count)


@pytest.mark.parametrize("layers, pp, vp", [(126, 8, 8), (30, 4, 8), (62, 4, 8)])
def test_stage_layers_reproduce_nemo_for_405b_and_proxies(layers, pp, vp):
    split = stage_layers(layers, pp, vp)
    for pp_rank in range(pp):
        for vp_rank, stage in enumerate(rank_stages(pp_rank, pp, vp)):
            assert stage == vp_rank * pp + pp_rank  # Megatron's interleaved order
            assert split[stage] == list(megatron_layers(layers, pp, vp, pp_rank, vp_rank))
    # Every layer is built exactly once, in order.
    assert [i for stage in split for i in stage] == list(range(layers))


def test_405b_split_facts():
    split = stage_layers(126, 8, 8)
    assert split[0] == [0] and split[63] == [125]  # embedding / loss take a layer's place
    assert all(len(s) == 2 for s in split[1:63])
    assert split[8] == [15, 16]  # pipeline rank 0's second chunk
    proxy30 = stage_layers(30, 4, 8)
    assert proxy30[0] == [] and proxy30[31] == []  # only the embedding, only the loss
    assert all(len(s) == 1 for s in proxy30[1:31])
    proxy62 = stage_layers(62, 4, 8)
    assert len(proxy62[0]) == len(proxy62[31]) == 1 and all(len(s) == 2 for s in proxy62[1:31])


def test_even_split_ignores_embedding_and_loss():
    assert stage_layers(4, 2, 2) == [[0], [1], [2], [3]]  # the tiny PP2 VP2 runs
    assert stage_layers(80, 4, 5) == [list(range(4 * i, 4 * i + 4)) for i in range(20)]
    with pytest.raises(ValueError):
        stage_layers(7, 2, 2)


def _problems(**over):
    try:
        planning.build_plan("pretrain_llama3.1", "tiny", "fp32", 8, "cpu", overrides=over)
    except planmod.PlanError as err:
        return err.problems
    return []


def test_pipeline_schedule_rules_are_validated():
    # GBS 8, MBS 2: DP 4 leaves one microbatch for two pipeline stages.
    (line,) = _problems(pp=2, dp=4)
    assert "at least PP = 2 microbatches" in line and "1F1B" in line
    (line,) = _problems(pp=2, vp=2, dp=4)
    assert "interleaved 1F1B" in line
    # Interleaved 1F1B runs GA // PP rounds and needs GA to be a multiple of them
    # (torch.distributed.pipelining's flexible interleaving).
    assert planning.pipeline_schedule_problems(6, 4, 2) == []  # 1 round of 6
    assert planning.pipeline_schedule_problems(10, 4, 2) == []  # 2 rounds of 5
    (line,) = planning.pipeline_schedule_problems(9, 4, 2)  # 2 rounds: 9 is odd
    assert "2 rounds" in line
    assert planning.pipeline_schedule_problems(9, 4, 1) == []  # plain 1F1B: any GA >= PP
    # Sequence parallelism splits each context shard over TP.
    assert any("CP*TP = 2*4" in p for p in _problems(tp=4, cp=2, dp=1, seq_len=132))


# The seed rows (the MoE rows' published layouts run PP and FP8, which the engine refuses
# for MoE: tests/test_moe_recipes.py covers them).
H100_ROWS = [r for r in recipes.RECIPES if r.gpu_type == "h100" and r.source.startswith("seed")]

# The seeds' H100 tables, counted by hand (scales x dtypes): Llama 3.1 8B 5 x 2, 70B 6 x 2,
# the 405B proxies 3 x 2 and 405B 3 x 2 (seed 002); Llama 2 70B 6 x 2 (seed 001);
# Nemotron-4 15B 8 x 2 and 340B (128 from seed 000, 256-2048 from seed 003) 5 x 2;
# Nemotron-H 56B 7 x 1 (FP8 only, seed 004).
SEED_ROWS = {("pretrain_llama3.1", "8b"): 10, ("pretrain_llama3.1", "70b"): 12,
             ("pretrain_llama3.1", "405b-proxy"): 6, ("pretrain_llama3.1", "405b"): 6,
             ("pretrain_llama2", "70b"): 12, ("pretrain_nemotron4", "15b"): 16,
             ("pretrain_nemotron4", "340b"): 10, ("pretrain_nemotronh", "56b"): 7}


def test_every_seed_row_dry_runs_at_real_size_with_its_rank_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_ROOT", str(tmp_path))
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(tmp_path / "cluster.yaml"))
    runner = CliRunner()
    counted: dict[tuple[str, str], int] = {}
    for row in H100_ROWS:
        counted[(row.workload, row.size)] = counted.get((row.workload, row.size), 0) + 1
    assert counted == SEED_ROWS and sum(SEED_ROWS.values()) == 79
    checked = 0
    for row in H100_ROWS:
        result = runner.invoke(app, ["run", "-w", row.workload, "-s", row.size, "--dtype",
                                     row.dtype, "--scale", str(row.gpus), "--gpu", "h100",
                                     "--dry-run"])
        where = f"{row.workload} {row.size} {row.dtype} x{row.gpus}"
        assert result.exit_code == 0, where + "\n" + result.output
        out = result.output
        layout = f"TP{row.tp} PP{row.pp} CP{row.cp} DP{row.dp}"
        assert layout in out and f"GA {row.ga}" in out, where
        assert "Per-rank layout" in out and "dry run: nothing launched" in out, where
        # Rank 0 holds the embedding; the last rank (always shown) the output and loss.
        assert "embedding" in out and "output+loss" in out, where
        last = rank_coordinates(row.gpus - 1, planning.build_plan(
            row.workload, row.size, row.dtype, row.gpus, "h100"))
        assert last == {"pp": row.pp - 1, "dp": row.dp - 1, "cp": row.cp - 1, "tp": row.tp - 1}
        checked += 1
    assert checked == 79
    assert not (tmp_path / "experiments").exists()  # a dry run writes nothing
