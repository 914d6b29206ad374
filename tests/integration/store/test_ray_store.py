"""Ray backend ownership: the registry actor owns the units, so they outlive the writer process."""

import time

import numpy as np

from knittrans.store.ray_store import RayUnitStore
from knittrans.types import UnitKey
from tests.fixtures.ray import TEST_NAMESPACE, TEST_REGISTRY
from tests.integration.store.units import unit


def make_writer_class():
    """Defined inside a function so Ray ships the class by value to its worker."""
    import ray

    @ray.remote(num_cpus=0)
    class Writer:
        def write_through_store(self, registry: str, namespace: str, key: str) -> bool:
            from knittrans.store.arrays import array_bytes, header_of
            from knittrans.store.protocol import UnitWrite
            from knittrans.store.ray_store import RayUnitStore
            from knittrans.types import DType

            store = RayUnitStore(registry=registry, namespace=namespace)
            array = np.arange(1 << 18, dtype=np.int32)
            store.put_many([UnitWrite.of(key, header_of(array, DType.INT32, sequence=True), array_bytes(array))])
            return True

        def put_own_object(self) -> list:
            # a list, so the caller receives the ref itself (owned by this process), not its value
            return [ray.put(np.arange(1 << 18, dtype=np.int32))]

    return Writer


def wait_until_lost(ref, timeout: float = 60.0) -> bool:
    """Ray learns of an owner's death asynchronously; poll until reads of its object fail."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(ref, timeout=5)
        except ray.exceptions.ObjectLostError:
            return True
        time.sleep(0.2)
    return False


def test_units_outlive_the_writer_and_its_own_objects_do_not(ray_store, prefix):
    import ray

    writer = make_writer_class().remote()
    key = UnitKey(f"{prefix}/owned-by-registry")
    assert ray.get(writer.write_through_store.remote(TEST_REGISTRY, TEST_NAMESPACE, key))
    [writer_owned] = ray.get(writer.put_own_object.remote())
    ray.kill(writer, no_restart=True)
    # The kill is asynchronous: a call sent just after it can still run. The first call that fails shows the
    # writer process gone.
    deadline = time.monotonic() + 30
    while True:
        try:
            ray.get(writer.put_own_object.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the writer still answers 30 s after ray.kill"
        time.sleep(0.1)

    # the alternative we did not choose: an object put by the writer itself dies with the writer
    assert wait_until_lost(writer_owned)
    # ... while the unit the writer stored through the registry is still there, after the loss was seen
    out = np.zeros(1 << 18, dtype=np.int32)
    ray_store.get_into(key, out)
    np.testing.assert_array_equal(out, np.arange(1 << 18, dtype=np.int32))
    ray_store.delete_many([key])


def test_deleting_a_unit_keeps_it_readable_for_a_reader_that_holds_it(ray_store, prefix):
    """Readers borrow refs: deletion drops the registry's reference only."""
    import ray

    key = UnitKey(f"{prefix}/borrowed")
    ray_store.put_many([unit(key, np.arange(1000, dtype=np.int64))])
    [ref] = ray.get(ray.get_actor(TEST_REGISTRY, namespace=TEST_NAMESPACE).lookup.remote([key]))
    held = ray.get(ref)
    assert ray_store.delete_many([key]) == 1
    assert ray_store.exists([key]) == [False]
    np.testing.assert_array_equal(held, np.arange(1000, dtype=np.int64).view(np.uint8))


def test_a_second_store_object_shares_the_named_registry(ray_store, prefix):
    key = UnitKey(f"{prefix}/shared")
    ray_store.put_many([unit(key, np.ones(10, dtype=np.float32))])
    other = RayUnitStore(registry=TEST_REGISTRY, namespace=TEST_NAMESPACE)
    assert other.exists([key]) == [True]
    other.delete_many([key])
