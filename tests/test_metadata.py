"""``zarr.json`` validation (:meth:`ArrayMetadata.from_json`): fields of the wrong type or out
of range, and fields strataio does not know, refused as the Zarr v3 spec asks, with a
MetadataError naming the file and the field."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import strataio
from strataio.arrays.metadata import ARRAY_FIELDS, ArrayMetadata
from strataio.errors import ArgumentError, MetadataError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

WHERE = "/data/run7/zarr.json"


def _doc(**create):
    kw = {"shape": (8, 8), "dtype": "int32", "chunks": (4, 4), "codec": "zstd+crc32c", **create}
    return json.loads(ArrayMetadata.create(**kw).to_json())


def _set(path, value):
    """A change of the document: ``path`` is a list of keys, the last one set to ``value``
    (``...`` deletes it)."""

    def change(doc):
        at = doc
        for key in path[:-1]:
            at = at[key]
        if value is ...:
            del at[path[-1]]
        else:
            at[path[-1]] = value

    return change


def _refused(doc, *said):
    with pytest.raises(MetadataError) as info:
        ArrayMetadata.from_json(json.dumps(doc), where=WHERE)
    message = str(info.value)
    assert WHERE in message
    for part in said:
        assert part in message, message
    return message


_GRID = ["chunk_grid", "configuration", "chunk_shape"]
_SHARD_INNER = ["codecs", 0, "configuration", "chunk_shape"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_set(["shape"], [-1]), "shape [-1] must be non-negative"),
        (_set(["shape"], [8, -3]), "shape [8, -3] must be non-negative"),
        (_set(["shape"], "8"), "shape must be a list of integers, got '8'"),
        (_set(["shape"], 8), "shape must be a list of integers, got 8"),
        (_set(["shape"], [8.0, 8]), "shape must be a list of integers"),
        (_set(["shape"], [8, True]), "shape must be a list of integers"),
        (_set(["shape"], None), "shape must be a list of integers"),
        (_set(_GRID, "4"), "chunk_grid chunk_shape must be a list of integers, got '4'"),
        (_set(_GRID, [4.5, 4]), "chunk_grid chunk_shape must be a list of integers"),
        (_set(_GRID, [False, 4]), "chunk_grid chunk_shape must be a list of integers"),
        (_set(_GRID, [0, 4]), "chunk_grid chunk_shape [0, 4] must be positive"),
        (_set(_GRID, [-4, 4]), "chunk_grid chunk_shape [-4, 4] must be positive"),
        (_set(_GRID, [4]), "chunk_grid chunk_shape [4] has 1 dimensions but shape [8, 8]"),
        (_set(_GRID, ...), "chunk_grid configuration has no 'chunk_shape'"),
        (_set(["chunk_grid", "configuration"], []), "chunk_grid configuration must be an object"),
        (_set(["chunk_grid"], 7), "chunk_grid must be an object or a name"),
        (_set(["shape"], ...), "the required field 'shape' is missing"),
        (_set(["codecs"], ...), "the required field 'codecs' is missing"),
        (_set(["fill_value"], ...), "the required field 'fill_value' is missing"),
        (_set(["codecs"], []), "codecs must be a non-empty list"),
        (_set(["codecs"], {"name": "bytes"}), "codecs must be a non-empty list"),
        (_set(["codecs", 1], 5), "codecs[1] must be a codec object or name"),
        (_set(["codecs", 1, "name"], 5), "codecs[1] name must be a string"),
        (_set(["codecs", 1, "configuration"], [1]), "codecs[1] (zstd) configuration must be"),
        (
            _set(["chunk_key_encoding", "configuration", "separator"], "-"),
            "chunk_key_encoding separator '-' is not '/' or '.'",
        ),
        (_set(["attributes"], [1, 2]), "attributes must be an object"),
        (_set(["storage_transformers"], "none"), "storage_transformers must be a list"),
        (_set(["fill_value"], "lots"), "fill_value 'lots' is not a int32 value"),
        (_set(["fill_value"], 1.5), "fill_value 1.5 is not a int32 value: not an integer"),
        (_set(["fill_value"], "NaN"), "fill_value 'NaN' is not a int32 value: not an integer"),
        (_set(["data_type"], {"name": "int32"}), "data type {'name': 'int32'} is not supported"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_names_the_file_and_the_field(change, said):
    doc = _doc()
    change(doc)
    _refused(doc, said)


@pytest.mark.parametrize(
    ("dtype", "fill", "said"),
    [
        ("bool", 2, "not true or false"),
        ("bool", 0.5, "not true or false"),
        ("bool", "NaN", "not true or false"),
        ("float32", 1e300, "beyond the range of float32"),
        ("float16", -70000, "beyond the range of float16"),
        ("float32", None, "null is no value"),
        ("complex64", [1.0, None], "null is no value"),
    ],
)
def test_a_fill_value_numpy_would_change_is_refused(dtype, fill, said):
    """numpy makes 2 or 0.5 a True, 1e300 a float32 inf and null a NaN (zarr-python and
    TensorStore refuse a null fill_value): such a fill_value is no value of the data type,
    and opening the array says so (true, false, 0 and 1 are bools; a float
    in range and the spec's special values open as before)."""
    doc = _doc(dtype=dtype, codec=None)
    doc["fill_value"] = fill
    _refused(doc, f"fill_value {fill!r} is not a", said)
    for fine in [True, False, 0, 1] if dtype == "bool" else [1.5, "Infinity", "NaN", 65504]:
        doc["fill_value"] = fine
        ArrayMetadata.from_json(json.dumps(doc), where=WHERE)


@pytest.mark.parametrize(
    ("dtype", "fill"),
    [
        ("int32", "7"),
        ("float32", "1.5"),
        ("float64", "inf"),
        ("uint8", "0x10"),
        ("complex64", ["0x3f800000", "nan"]),
    ],
)
def test_a_fill_value_string_the_spec_does_not_define_is_refused(dtype, fill):
    """The spec's strings are "NaN", "Infinity", "-Infinity" and, for floats, "0x" and the
    bits; numpy would read "7" as 7 and "inf" as inf, zarr-python and TensorStore refuse
    them."""
    doc = _doc(dtype=dtype, codec=None)
    doc["fill_value"] = fill
    _refused(doc, f"fill_value {fill!r} is not a", "a string other than 'NaN', 'Infinity'")


def test_a_sharded_arrays_inner_chunk_shape_is_checked_too():
    doc = _doc(chunks=(2, 2), shards=(4, 4))
    for bad in ("22", [2.0, 2], [0, 2], None):
        changed = copy.deepcopy(doc)
        _set(_SHARD_INNER, bad)(changed)
        _refused(changed, "codecs[0] (sharding_indexed) chunk_shape")
    changed = copy.deepcopy(doc)
    changed["codecs"][0]["configuration"]["codecs"][0]["configuration"]["order"] = "C"
    _refused(changed, "codecs[0].codecs[0] (bytes) configuration has unknown key 'order'")


def test_open_dataset_with_a_negative_shape_names_the_file(tmp_path):
    """The spec violation that used to pass from_json and fail later in the Dataset with an
    ArgumentError naming no file."""
    strataio.create_dataset(tmp_path / "a", (8,), "f4", (4,))
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    doc["shape"] = [-1]
    path.write_text(json.dumps(doc))
    with pytest.raises(MetadataError, match="shape") as info:
        strataio.open_dataset(tmp_path / "a")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [1, "x", [1], None, {}, {"must_understand": True}, {"must_understand": "false"}, {"a": 1}],
)
def test_an_unknown_field_not_marked_may_be_ignored_is_refused(value):
    doc = _doc()
    doc["consolidated"] = value
    _refused(doc, "unknown field 'consolidated'", "must_understand")


def test_an_unknown_field_marked_may_be_ignored_is_kept_and_written_back(tmp_path):
    """The spec's one exception: an object with "must_understand": false is opened, and an
    attribute change (which rewrites zarr.json) keeps it."""
    ds = strataio.create_dataset(tmp_path / "a", (4,), "i2", (2,))
    ds[:] = [1, 2, 3, 4]
    path = tmp_path / "a" / "zarr.json"
    doc = json.loads(path.read_text())
    note = {"must_understand": False, "provenance": {"by": "someone else"}}
    doc["x_note"] = note
    path.write_text(json.dumps(doc))
    back = strataio.open_dataset(tmp_path / "a", "r+")
    np.testing.assert_array_equal(back[:], [1, 2, 3, 4])
    back.attrs["step"] = 2
    assert json.loads(path.read_text())["x_note"] == note
    assert strataio.open_dataset(tmp_path / "a").attrs["step"] == 2


def test_every_field_strataio_writes_is_known():
    metas = [
        ArrayMetadata.create((4, 6), "f8", (2, 3), codec=c, attrs={"a": 1}, dims=["y", "x"])
        for c in (None, "zstd", "gzip", "blosc", "lz4", "crc32c", "zstd+crc32c")
    ]
    metas.append(ArrayMetadata.create((4, 6), ">i4", (2, 3), codec="zstd", shards=(4, 6)))
    for meta in metas:
        doc = json.loads(meta.to_json())
        assert set(doc) <= ARRAY_FIELDS
        assert ArrayMetadata.from_json(meta.to_json()) == meta


@pytest.mark.parametrize("field", ["chunk_grid", "chunk_key_encoding"])
def test_must_understand_false_is_refused_where_the_spec_does_not_allow_it(field):
    doc = _doc()
    doc[field]["must_understand"] = False
    _refused(doc, field, "must_understand to false")
    doc[field]["must_understand"] = True  # (what the spec implies anyway)
    ArrayMetadata.from_json(json.dumps(doc), where=WHERE)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_set(["chunk_grid", "extent"], 3), "chunk_grid has unknown key 'extent'"),
        (
            _set(["chunk_grid", "configuration", "offset"], [0, 0]),
            "chunk_grid configuration has unknown key 'offset'",
        ),
        (_set(["chunk_key_encoding", "x"], 1), "chunk_key_encoding has unknown key 'x'"),
        (
            _set(["chunk_key_encoding", "configuration", "prefix"], "d"),
            "chunk_key_encoding configuration has unknown key 'prefix'",
        ),
        (_set(["codecs", 1, "threads"], 4), "codecs[1] has unknown key 'threads'"),
        (
            _set(["codecs", 1, "configuration", "dictionary"], "abc"),
            "codecs[1] (zstd) configuration has unknown key 'dictionary'",
        ),
        (
            _set(["codecs", 2, "configuration"], {"seed": 1}),
            "codecs[2] (crc32c) configuration has unknown key 'seed'",
        ),
        (_set(["codecs", 1, "must_understand"], "no"), "must_understand must be true or false"),
        # (an unknown codec is refused even where it says it may be ignored: see metadata.py)
        (
            lambda d: d["codecs"].insert(2, {"name": "x.stats", "must_understand": False}),
            "codec 'x.stats' is not supported",
        ),
    ],
)
def test_extension_objects_follow_the_same_rule(change, said):
    doc = _doc()
    change(doc)
    _refused(doc, said)


def test_short_hand_names_are_read_as_objects():
    """The spec's short-hand forms (a name for an object with no configuration)."""
    doc = _doc()
    doc["codecs"][2] = "crc32c"
    doc["chunk_key_encoding"] = "default"
    meta = ArrayMetadata.from_json(json.dumps(doc), where=WHERE)
    assert meta.codecs[2] == {"name": "crc32c"} and meta.separator == "/"


@pytest.mark.parametrize(
    ("shape", "chunks", "shards", "named", "value"),
    [
        ((4.0,), (2,), None, "shape", "4.0"),
        ((8, 4.0), (2, 2), None, "shape", "4.0"),
        ((True,), None, None, "shape", "True"),
        ((4,), (True,), None, "chunks", "True"),
        ((4,), (2.0,), None, "chunks", "2.0"),
        ((4,), np.array([2.0]), None, "chunks", "2.0"),
        ((8,), (2,), (4.0,), "shards", "4.0"),
        ((8,), (2,), (np.bool_(True),), "shards", "True"),
    ],
)
def test_a_shape_chunk_or_shard_entry_that_is_not_an_integer_is_refused_before_a_write(
    tmp_path, shape, chunks, shards, named, value
):
    """4.0 and True are not integers (numpy integers are), for a plain dataset and a
    catalogued one alike: ArgumentError names the argument and the value, nothing stored."""
    with pytest.raises(ArgumentError, match=rf"{named} must be a sequence of integers.*{value}"):
        strataio.create_dataset(tmp_path / "a", shape, "f4", chunks, shards=shards)
    assert not (tmp_path / "a").exists()
    if shards is None:
        tiers = TierSet([Tier("disk", PosixBackend(tmp_path / "disk"), "localdisk")])
        with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
            with pytest.raises(ArgumentError, match=rf"{named} must be a sequence.*{value}"):
                s.create_dataset("a", shape, "f4", chunks)
            assert s.catalog.list_datasets() == []
    ds = strataio.create_dataset(tmp_path / "b", (np.int64(8),), "f4", [np.int32(4)])
    assert ds.shape == (8,) and ds.chunks == (4,)
    assert all(type(n) is int for n in ds.shape + ds.chunks)
