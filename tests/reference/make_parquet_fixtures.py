"""Parquet fixtures for the dataset reader (core/dataset/, tests/dataset/test_parquet.c).

Writes tests/fixtures/parquet/NAME.parquet with the `datasets` library and pyarrow (the writers
Hub datasets come from), and NAME.jsonl: the same rows as pyarrow itself reads them back
(table.to_pylist()), which the C test compares row by row. Covered: a conversational SFT set
(`messages`, list<struct<role, content>>) written by datasets (snappy, several row groups), a
prompt/completion set (dictionary encoding, data page v2, uncompressed, a null column), a
preference set (conversational chosen/rejected, zstd, data page v1, nullable floats and bools), a
set of other types (nested lists with null elements, structs, empty and null lists, integers of
every width, gzip, no dictionary), and the arithmetic SFT set of tests/dataset/test_parquet_train.sh
(also as JSONL, for the loss-curve comparison); the DELTA encodings and BYTE_STREAM_SPLIT; a map. And Arrow IPC in tests/fixtures/arrow/: the chat set
as a `datasets` save_to_disk DatasetDict (train and test folders), more types as a ZSTD stream of
several record batches and in the file format, with their rows as JSONL. Run: /work/venv/bin/python tests/reference/make_parquet_fixtures.py
"""
import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "parquet")
ARROW = os.path.join(os.path.dirname(__file__), "..", "fixtures", "arrow")


def write_jsonl(name, table):
    with open(os.path.join(OUT, name + ".jsonl"), "w") as f:
        for row in table.to_pylist():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def readback(name):
    return pq.read_table(os.path.join(OUT, name + ".parquet"))


def sft_messages():
    rows = []
    for i in range(20):
        a, b = 3 * i + 1, 7 * i % 11
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": "You are terse."})
        msgs.append({"role": "user", "content": f"What is {a} + {b}?"})
        msgs.append({"role": "assistant", "content": f"{a + b}"})
        if i % 4 == 1:
            msgs += [{"role": "user", "content": "Thanks ✓"}, {"role": "assistant", "content": "Welcome."}]
        rows.append({"messages": msgs, "source": None if i % 5 == 2 else f"arith-{i % 3}", "id": i})
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(os.path.join(OUT, "sft_messages.parquet"), batch_size=6)  # 4 row groups, snappy
    write_jsonl("sft_messages", readback("sft_messages"))


def prompt_completion():
    prompts = [f"Q: {a}*{b}= A:" for a in range(4) for b in range(6)]
    table = pa.table({
        "prompt": prompts,
        "completion": [" " + str(eval(p[3:-3].replace("=", ""))) for p in prompts],
        "tag": ["even" if i % 2 == 0 else "odd" for i in range(len(prompts))],  # dictionary-friendly
        "note": pa.array([None] * len(prompts), type=pa.string()),  # a column of nulls
    })
    pq.write_table(table, os.path.join(OUT, "prompt_completion.parquet"), row_group_size=5, compression="none",
                   use_dictionary=True, data_page_version="2.0")
    write_jsonl("prompt_completion", readback("prompt_completion"))


def preference():
    rows = []
    for i in range(12):
        q = f"Is {i} even?"
        good, bad = ("Yes." if i % 2 == 0 else "No."), ("No." if i % 2 == 0 else "Yes.")
        rows.append({
            "prompt": [{"role": "user", "content": q}],
            "chosen": [{"role": "assistant", "content": good}],
            "rejected": [{"role": "assistant", "content": bad}],
            "score": None if i % 4 == 3 else i / 8.0,
            "flag": None if i % 5 == 4 else i % 3 == 0,
        })
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, os.path.join(OUT, "preference.parquet"), row_group_size=4, compression="zstd",
                   data_page_version="1.0")
    write_jsonl("preference", readback("preference"))


def types():
    n = 7
    table = pa.table({
        "i8": pa.array([(-1) ** i * i for i in range(n)], type=pa.int8()),
        "u32": pa.array([4000000000 - i for i in range(n)], type=pa.uint32()),
        "i64": pa.array([None if i == 3 else -(2 ** 40) * i for i in range(n)], type=pa.int64()),
        "f32": pa.array([0.1 * i for i in range(n)], type=pa.float32()),
        "f64": pa.array([None if i % 3 == 1 else 1.5 ** i for i in range(n)], type=pa.float64()),
        "ints": pa.array([[1, None, 3], [], None, [4], [5, 6], [None], [7, 8, 9]], type=pa.list_(pa.int32())),
        "words": pa.array([[["a", "b"], []], None, [["c"]], [], [None, ["d", None]], [["e"]], [[]]],
                          type=pa.list_(pa.list_(pa.string()))),
        "point": pa.array([{"x": i, "label": None if i == 2 else f"p{i}"} if i != 4 else None for i in range(n)],
                          type=pa.struct([("x", pa.int32()), ("label", pa.string())])),
        "text": pa.array(["", "héllo", None, "tab\there", "quote \" and \\", "line\nbreak", "日本"],
                         type=pa.large_string()),
    })
    pq.write_table(table, os.path.join(OUT, "types.parquet"), row_group_size=3, compression="gzip",
                   use_dictionary=False)
    write_jsonl("types", readback("types"))


def encodings():
    """The DELTA encodings and BYTE_STREAM_SPLIT (what pyarrow writes when asked; other writers'
    parquet 2 defaults): 300 rows, several delta blocks, nulls, wide and negative deltas."""
    n = 300
    words = ["prefix_shared_%04d" % (i * 7 % 1000) for i in range(n)]
    words.sort()
    table = pa.table({
        "i32": pa.array([None if i % 11 == 5 else (i * 37) % 1000 - 500 for i in range(n)], type=pa.int32()),
        "i64": pa.array([(-1) ** i * (i ** 5) for i in range(n)], type=pa.int64()),
        "text": pa.array([None if i % 13 == 0 else f"line {i}: " + "x" * (i % 17) for i in range(n)]),
        "sorted": pa.array(words),
        "f32": pa.array([None if i % 7 == 3 else i / 3.0 for i in range(n)], type=pa.float32()),
        "f64": pa.array([i * 1e-3 - 0.1 for i in range(n)], type=pa.float64()),
    })
    pq.write_table(table, os.path.join(OUT, "encodings.parquet"), use_dictionary=False, compression="snappy",
                   data_page_version="2.0", row_group_size=200,
                   column_encoding={"i32": "DELTA_BINARY_PACKED", "i64": "DELTA_BINARY_PACKED",
                                    "text": "DELTA_LENGTH_BYTE_ARRAY", "sorted": "DELTA_BYTE_ARRAY",
                                    "f32": "BYTE_STREAM_SPLIT", "f64": "BYTE_STREAM_SPLIT"})
    write_jsonl("encodings", readback("encodings"))


def map_column():
    """A MAP column (read as a list of {key, value} objects; pyarrow reads pairs, so no JSONL)."""
    table = pa.table({"m": pa.array([[("a", 1), ("b", None)], None, []], type=pa.map_(pa.string(), pa.int32()))})
    pq.write_table(table, os.path.join(OUT, "map.parquet"))
    assert pq.read_table(os.path.join(OUT, "map.parquet")).to_pylist() == [
        {"m": [("a", 1), ("b", None)]}, {"m": None}, {"m": []}]


def arithmetic():
    rows = []
    for i in range(48):
        a, b = (i * 17) % 50, (i * 29 + 3) % 50
        rows.append({"messages": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": f"{a + b}"}]})
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(os.path.join(OUT, "arithmetic.parquet"), batch_size=16)
    write_jsonl("arithmetic", readback("arithmetic"))


def arrow():
    """Arrow IPC: a `datasets` save_to_disk DatasetDict (train, test; the streaming format), a
    stream with ZSTD buffers and several record batches, and the file format."""
    import shutil
    import pyarrow.ipc as ipc
    sd = os.path.join(ARROW, "chat_dict")
    shutil.rmtree(sd, ignore_errors=True)
    chat = datasets.Dataset.from_parquet(os.path.join(OUT, "sft_messages.parquet"))
    datasets.DatasetDict({"train": chat, "test": chat.select(range(5))}).save_to_disk(sd)
    with open(os.path.join(ARROW, "chat_dict.train.jsonl"), "w") as f:
        for row in chat.to_list():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    n = 7
    table = pa.table({
        "u8": pa.array([250 + i % 6 for i in range(n)], type=pa.uint8()),
        "i16": pa.array([None if i == 1 else -300 * i for i in range(n)], type=pa.int16()),
        "u64": pa.array([2 ** 40 + i for i in range(n)], type=pa.uint64()),
        "f32": pa.array([0.25 * i for i in range(n)], type=pa.float32()),
        "ok": pa.array([None if i == 5 else i % 2 == 0 for i in range(n)], type=pa.bool_()),
        "nothing": pa.nulls(n),
        "ids": pa.array([[1, 2], [], None, [3], [None, 4], [5], [6, 7, 8]], type=pa.large_list(pa.int64())),
        "pair": pa.array([[i, -i] if i != 3 else None for i in range(n)], type=pa.list_(pa.int32(), 2)),
        "point": pa.array([{"x": i, "label": None if i == 2 else f"p{i}"} if i != 4 else None for i in range(n)],
                          type=pa.struct([("x", pa.int32()), ("label", pa.string())])),
        "text": pa.array(["", "héllo", None, "tab\there", "quote \" and \\", "line\nbreak", "日本"],
                         type=pa.large_string()),
        "words": pa.array([["a", "b"], None, [], ["c", None], ["d"], ["e", "f"], []], type=pa.list_(pa.string())),
    })
    with ipc.new_stream(os.path.join(ARROW, "types_zstd.arrow"), table.schema,
                        options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table, max_chunksize=3)
    with ipc.new_file(os.path.join(ARROW, "types_file.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=4)
    with open(os.path.join(ARROW, "types.jsonl"), "w") as f:
        for row in ipc.open_stream(os.path.join(ARROW, "types_zstd.arrow")).read_all().to_pylist():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(ARROW, exist_ok=True)
    sft_messages()
    prompt_completion()
    preference()
    types()
    encodings()
    map_column()
    arithmetic()
    arrow()
    for d in (OUT, ARROW):
        for f in sorted(os.listdir(d)):
            print(f, os.path.getsize(os.path.join(d, f)))
