"""The committed generated code must match what `make proto` would produce from the .proto files."""

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "clients" / "python" / "knittrans" / "v1"


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto" / "knittrans" / "v1").glob("*.proto"))
    assert protos, "no .proto files found"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", *protos],
        cwd=ROOT, check=True,
    )
    fresh = tmp_path / "knittrans" / "v1"
    fresh_files = sorted(p.name for p in fresh.iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir() if p.suffix in (".py", ".pyi") and p.name != "__init__.py")
    assert fresh_files == committed, "generated files differ from the committed set; run `make proto`"
    mismatched = [name for name in fresh_files if not filecmp.cmp(fresh / name, GENERATED / name, shallow=False)]
    assert not mismatched, f"stale generated code, run `make proto`: {mismatched}"


def test_buf_lint_is_clean() -> None:
    buf = Path(sys.executable).with_name("buf")
    result = subprocess.run([str(buf), "lint"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
