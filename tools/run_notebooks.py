#!/usr/bin/env python3
"""Execute every notebook in a folder, top to bottom, the way Colab would (part of `make test`).

Each notebook runs with the repository root as its working directory and the environment
variable LLM_REPO_ROOT set, so its first cell skips the `git clone` it does on Colab. Cells
that need a GPU check for one themselves and print why they skip; nothing is deleted.
A cell that raises fails the test. Usage: tools/run_notebooks.py notebooks [--timeout 1200]
"""
import argparse
import os
import sys
import time

try:
    import nbformat
    from nbclient import NotebookClient
except ImportError:
    sys.exit("run_notebooks: nbclient/nbformat missing: run tools/install-deps.sh")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = ap.parse_args()
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    books = sorted(f for f in os.listdir(args.folder) if f.endswith(".ipynb"))
    if not books:
        sys.exit(f"run_notebooks: no notebooks in {args.folder}")
    os.environ["LLM_REPO_ROOT"] = root
    os.environ.setdefault("MPLBACKEND", "Agg")
    failed = 0
    for name in books:
        path = os.path.join(args.folder, name)
        nb = nbformat.read(path, as_version=4)
        t0 = time.time()
        client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                                resources={"metadata": {"path": root}})
        try:
            client.execute()
            print(f"[notebook] PASS {name} ({time.time() - t0:.1f} s, {len(nb.cells)} cells)")
        except Exception as e:  # nbclient raises CellExecutionError with the traceback
            failed += 1
            print(f"[notebook] FAIL {name}: {e}")
    print(f"[notebook] Synthesis: Tested: {len(books)} | Passing: {len(books) - failed} | Failing: {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
