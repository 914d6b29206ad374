"""Every element of every .proto file carries a leading comment, so `grpcurl describe` explains all of it.

The descriptors are compiled afresh with source info, so any field, message, enum, enum value, oneof, service or
RPC added later without a comment fails here too.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto" / "knittrans" / "v1"

# Field numbers of the repeated fields in descriptor.proto that source-info paths walk through.
FILE_MESSAGES, FILE_ENUMS, FILE_SERVICES = 4, 5, 6
MESSAGE_FIELDS, MESSAGE_NESTED, MESSAGE_ENUMS, MESSAGE_ONEOFS = 2, 3, 4, 8
ENUM_VALUES = 2
SERVICE_METHODS = 2


def compiled(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    protos = sorted(str(p.relative_to(ROOT)) for p in PROTO_DIR.glob("*.proto"))
    assert protos, "no .proto files found"
    out = tmp_path / "descriptors.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", "--include_source_info",
         f"--descriptor_set_out={out}", *protos],
        cwd=ROOT, check=True,
    )
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[tuple[int, ...], str]]:
    """Every commentable element: its source-info path and a readable name."""
    package = file.package

    def message(m: descriptor_pb2.DescriptorProto, path: tuple[int, ...], name: str) -> Iterator:
        yield path, f"message {name}"
        for i, f in enumerate(m.field):
            yield (*path, MESSAGE_FIELDS, i), f"field {name}.{f.name}"
        synthetic = {f.oneof_index for f in m.field if f.proto3_optional}  # `optional x`: no oneof in the source
        for i, o in enumerate(m.oneof_decl):
            if i not in synthetic:
                yield (*path, MESSAGE_ONEOFS, i), f"oneof {name}.{o.name}"
        for i, nested in enumerate(m.nested_type):
            if not nested.options.map_entry:  # a map<> field's implicit entry has no source of its own
                yield from message(nested, (*path, MESSAGE_NESTED, i), f"{name}.{nested.name}")
        for i, e in enumerate(m.enum_type):
            yield from enum(e, (*path, MESSAGE_ENUMS, i), f"{name}.{e.name}")

    def enum(e: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], name: str) -> Iterator:
        yield path, f"enum {name}"
        for i, v in enumerate(e.value):
            yield (*path, ENUM_VALUES, i), f"enum value {name}.{v.name}"

    for i, m in enumerate(file.message_type):
        yield from message(m, (FILE_MESSAGES, i), f"{package}.{m.name}")
    for i, e in enumerate(file.enum_type):
        yield from enum(e, (FILE_ENUMS, i), f"{package}.{e.name}")
    for i, s in enumerate(file.service):
        yield (FILE_SERVICES, i), f"service {package}.{s.name}"
        for j, rpc in enumerate(s.method):
            yield (FILE_SERVICES, i, SERVICE_METHODS, j), f"rpc {package}.{s.name}.{rpc.name}"


def leading_comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    return {tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location}


def uncommented(files: descriptor_pb2.FileDescriptorSet) -> list[str]:
    missing = []
    for file in files.file:
        comments = leading_comments(file)
        missing += [f"{file.name}: {name}" for path, name in _elements(file) if not comments.get(path)]
    return missing


def test_every_proto_element_has_a_leading_comment(tmp_path: Path) -> None:
    files = compiled(tmp_path)
    assert {f.name for f in files.file} == {f"knittrans/v1/{p.name}" for p in PROTO_DIR.glob("*.proto")}
    missing = uncommented(files)
    assert not missing, f"{len(missing)} elements have no leading comment:\n" + "\n".join(missing)


def test_the_check_sees_an_uncommented_field_of_any_kind(tmp_path: Path) -> None:
    """The walker itself: a file with one element of each kind, all but one commented, reports exactly that one."""
    (tmp_path / "proto" / "x").mkdir(parents=True)
    source = tmp_path / "proto" / "x" / "probe.proto"
    source.write_text(
        """syntax = "proto3";
package x;
// A service.
service S {
  // A call.
  rpc Call(M) returns (M);
}
// A message.
message M {
  // A nested message.
  message Inner {
    // A field.
    int32 a = 1;
  }
  // A nested enum.
  enum Kind {
    // Unset.
    KIND_UNSPECIFIED = 0;
    KIND_ONE = 1;
  }
  // A choice.
  oneof choice {
    // One way.
    Inner inner = 1;
    // Another.
    Kind kind = 2;
  }
  // A map.
  map<string, int32> counts = 3;
  // Maybe set.
  optional int32 maybe = 4;
}
"""
    )
    out = tmp_path / "probe.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path / 'proto'}", "--include_source_info",
         f"--descriptor_set_out={out}", str(source)],
        check=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert uncommented(files) == ["x/probe.proto: enum value x.M.Kind.KIND_ONE"]


def test_admitted_at_is_documented_as_unix_seconds(tmp_path: Path) -> None:
    """The service stamps admissions with its wall clock (tests/integration/admission checks the value)."""
    admission = next(f for f in compiled(tmp_path).file if f.name == "knittrans/v1/admission.proto")
    comments = leading_comments(admission)
    message = next(i for i, m in enumerate(admission.message_type) if m.name == "MiniBatchAdmission")
    field = next(i for i, f in enumerate(admission.message_type[message].field) if f.name == "admitted_at")
    comment = comments[(FILE_MESSAGES, message, MESSAGE_FIELDS, field)]
    assert "Unix seconds" in comment and "since the service started" not in comment
