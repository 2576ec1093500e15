"""The fork server that workers are forked from imports what they need, once per launching process.

A tiny CPU launch spent most of its time in each rank importing scikit-learn for the digits (3-4 s
of CPU per rank on two cores); the fork server now imports a data set's lazy modules before it
forks. Each check runs in a fresh interpreter: this test process's own fork server may already run.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from synapse.data import dataset_lazy_imports, dataset_names
from tests.conftest import repo_env

pytestmark = [pytest.mark.dist]


def run_python(code: str, tmp_path) -> str:
    script = tmp_path / "check.py"  # a file, not -c: the fork server imports __main__ from its path
    script.write_text(textwrap.dedent(code))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=repo_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_digits_declares_the_module_it_imports_lazily_and_only_it(tmp_path):
    # Importing the data package stays cheap; building the digits imports exactly what it declares.
    out = run_python("""
        import sys
        from synapse.data import build_dataset, dataset_lazy_imports
        print(sorted(m for m in dataset_lazy_imports("digits") if m in sys.modules))
        build_dataset("digits", "val", image_size=8)
        print(sorted(m for m in dataset_lazy_imports("digits") if m in sys.modules))
    """, tmp_path)
    assert out.splitlines() == ["[]", str(sorted(dataset_lazy_imports("digits")))]
    assert dataset_lazy_imports("digits"), "digits imports scikit-learn lazily and must say so"
    assert all(dataset_lazy_imports(name) == () for name in dataset_names() if name != "digits")


def test_a_worker_forked_for_a_digits_run_finds_the_worker_code_and_scikit_learn_imported(tmp_path):
    out = run_python("""
        import multiprocessing, sys
        from synapse.launch.elastic import START_METHOD, preload_worker_modules

        def report(queue):
            queue.put(sorted(m for m in ("synapse.pipeline.worker", "sklearn.datasets") if m in sys.modules))

        if __name__ == "__main__":
            preload_worker_modules("digits")
            context = multiprocessing.get_context(START_METHOD)
            queue = context.Queue()
            child = context.Process(target=report, args=(queue,))
            child.start()
            print(queue.get(timeout=150))
            child.join()
    """, tmp_path)
    assert out == str(["sklearn.datasets", "synapse.pipeline.worker"])
