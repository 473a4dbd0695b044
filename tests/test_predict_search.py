"""`--search`: enumerate layouts, drop what does not fit, rank by predicted step time."""

from trainbench.predict.search import candidate_overrides, search


def test_llama31_70b_bf16_on_64_h100_ranks_the_seed_layout_in_its_top_5():
    # Seed 002: Llama 3.1 70B BF16 on 64 H100 runs TP4 PP4 CP2 VP5 MBS1.
    result = search("pretrain_llama3.1", "70b", "bf16", 64, "h100")
    assert result.recipe_key == (4, 4, 2, 5, 1, "none", "full")
    rank = result.layout_rank_of(result.recipe_key)
    assert rank is not None and rank <= 5
    # Every ranked layout is valid, fits with headroom and is sorted by step time.
    times = [c.prediction.step_time_s for c in result.ranked]
    assert times == sorted(times)
    for cand in result.ranked:
        mem = cand.prediction.memory
        assert mem.total <= (1 - result.headroom) * mem.capacity
        assert cand.plan.gbs == 128 and cand.plan.gpus == 64
    assert result.not_fitting > 0 and result.invalid >= 0
    best = result.best_per_layout()
    families = [(c.plan.layout.tp, c.plan.layout.pp, c.plan.layout.cp, c.plan.mbs) for c in best]
    assert len(families) == len(set(families))
    assert best[0].why()


def test_candidates_respect_heads_nodes_and_fixed_keys():
    cands = candidate_overrides("pretrain_llama3.1", "8b", 16, "h100", {"cp": 2})
    assert cands and all(c["cp"] == 2 for c in cands)
    assert all(c["tp"] <= 8 and 8 % c["tp"] == 0 for c in cands)  # 8 KV heads, 8 GPUs a node
    assert all(c["tp"] * c["pp"] * c["cp"] * c["dp"] == 16 for c in cands)
    hybrid = candidate_overrides("pretrain_nemotronh", "56b", 32, "h100", {})
    assert all(c["cp"] == 1 for c in hybrid)  # Mamba layers have no context parallelism


def test_search_with_a_fixed_key_and_an_impossible_scale():
    fixed = search("pretrain_llama3.1", "8b", "bf16", 8, "h100", overrides={"tp": 2})
    assert fixed.ranked and all(c.plan.layout.tp == 2 for c in fixed.ranked)
    none = search("pretrain_llama3.1", "405b", "bf16", 8, "h100", overrides={"gbs": 64})
    assert none.ranked == [] and none.not_fitting > 0


def test_engine_search_weighs_the_data_parallel_sharding():
    """As the engine runs it, each layout without a pipeline comes in all three shardings.
    On the 8B seed row (32 microbatches a step) the fewer collectives a sharding issues,
    the faster and the more it holds: optimizer (weights gathered and gradients reduced
    once a step) before gradients (weights gathered once, gradients reduced every
    microbatch) before full (both every microbatch). With bf16 gradients all fit, and the
    seed's own layout, as optimizer, is among the top three, within 5% of the best (its
    32 microbatches accumulate gradients unsharded, a pass over the weights each). Under
    PP the shardings are one program, so only one is listed."""
    result = search("pretrain_llama3.1", "8b", "bf16", 8, "h100", sharding="engine",
                    overrides={"reduce_dtype": "bf16"})
    family = {c.plan.dp_sharding: c.prediction for c in result.ranked
              if c.key[:6] == (1, 1, 2, 1, 1, "none")}
    order = ["optimizer", "gradients", "full"]
    assert set(family) == set(order)
    times = [family[s].step_time_s for s in order]
    memory = [family[s].memory.total for s in order]
    assert times == sorted(times) and len(set(times)) == 3
    assert memory == sorted(memory, reverse=True) and len(set(memory)) == 3
    rank = result.layout_rank_of(result.recipe_key)
    assert rank is not None and rank <= 3
    best = result.best_per_layout()
    assert best[rank - 1].plan.dp_sharding == "optimizer"
    assert best[rank - 1].prediction.step_time_s <= 1.05 * best[0].prediction.step_time_s
    assert all(c.plan.dp_sharding == "full" for c in result.ranked if c.plan.layout.pp > 1)
    # The recipe's framework has one sharding of its own: nothing to choose.
    recipe = search("pretrain_llama3.1", "8b", "bf16", 8, "h100")
    assert {c.plan.dp_sharding for c in recipe.ranked} == {"full"}


def test_a_search_with_offloaded_layers_ranks_pipeline_free_layouts_only():
    # Offloading is modelled at PP1 (every published recipe that offloads runs PP1), so a
    # search told the run offloads keeps to PP1 instead of failing on the first PP layout.
    from trainbench.predict.context import MegatronRun
    run = MegatronRun(fused_loss=True, offload_layers=20)
    result = search("pretrain_llama3.1", "70b", "fp8", 64, "gb300", sharding="fsdp",
                    megatron=run)
    assert result.ranked
    assert {c.plan.layout.pp for c in result.ranked} == {1}
    assert all("first 20 layers in host memory" in c.prediction.memory.assumption
               for c in result.ranked)
