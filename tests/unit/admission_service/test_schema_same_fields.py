"""A report whose trajectories all carry the same fields is checked from one trajectory's units (schema.py's fast
path): that must still refuse a field that breaks the job's schema in every trajectory, and name it, as checking
each trajectory alone does."""

from __future__ import annotations

import pytest

from knittrans.admission.service.schema import check_schema, schema_of
from knittrans.admission.service.trajectory_columns import TrajectoryColumns
from knittrans.errors import InvalidArgument
from knittrans.v1 import trajectory_pb2
from knittrans.wire.columns import batch_from_messages
from tests.unit.admission_service.test_plan_off_loop import reported


def _columns(messages: list[trajectory_pb2.TrajectoryMetadata]) -> TrajectoryColumns:
    return TrajectoryColumns.from_proto(batch_from_messages(messages))


def _with_dtype(index: int, dtype: int) -> trajectory_pb2.TrajectoryMetadata:
    message = reported(index)
    message.units[0].header.dtype = dtype
    return message


def _renamed(index: int) -> trajectory_pb2.TrajectoryMetadata:
    message = reported(index)
    message.units[0].field_name = "token_ids"
    message.units[0].key = f"t{index}/token_ids"
    return message


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize(("build", "field", "phrase"), [
    (lambda i: _with_dtype(i, trajectory_pb2.D_TYPE_FLOAT32), "trajectories[0].units[0].header.dtype", "the job's is"),
    (_renamed, "trajectories[0].units[0].field_name", "not among the job's fields"),
])
def test_a_report_breaking_the_schema_in_every_trajectory_is_refused(count, build, field, phrase) -> None:
    schema = schema_of(_columns([reported(100)]), 0, ())
    check_schema(_columns([reported(i) for i in range(count)]), schema, ())  # the same fields pass
    with pytest.raises(InvalidArgument, match=phrase) as error:
        check_schema(_columns([build(i) for i in range(count)]), schema, ())
    assert error.value.field == field
