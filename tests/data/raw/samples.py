"""Raw-day samples the raw package's tests share."""

import random

import pyarrow.parquet as pq

from criteo_dlrm.common.schema import COLUMNS, PARQUET_SCHEMA


def parquet_rows(parquet) -> list[tuple]:
    table = pq.read_table(parquet)
    assert table.schema.equals(PARQUET_SCHEMA)
    return list(zip(*(table.column(name).to_pylist() for name in COLUMNS), strict=True))


def good_line(seed: int = 0) -> str:
    rng = random.Random(seed)
    dense = [str(rng.randint(-3, 5000)) if rng.random() > 0.3 else "" for _ in range(13)]
    sparse = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.2 else "" for _ in range(26)]
    return "\t".join([str(rng.randint(0, 1)), *dense, *sparse])


def file_with_bad_lines(path):
    good = [good_line(seed) for seed in range(8)]
    fields = good[0].split("\t")
    bad = {
        2: "\t".join(fields[:-1]),  # 39 fields
        4: "\t".join(["2", *fields[1:]]),  # label not 0/1
        5: "\t".join([fields[0], "12x", *fields[2:]]),  # count not an integer
        7: "\t".join([*fields[:-1], "123456789"]),  # 9 hex digits
        8: "",  # empty line
        9: "\t".join([*fields[:20], "zzzz", *fields[21:]]),  # not hex
        10: "\t".join([*fields, "extra"]),  # 41 fields
    }
    lines, good_iter = [], iter(good)
    for number in range(1, 13):
        lines.append(bad[number] if number in bad else next(good_iter))
    path.write_text("\n".join(lines) + "\n")
    return lines, bad


def write_labelled(tmp_path):
    path = tmp_path / "labelled_day"
    path.write_text(good_line(1) + "\n")
    return path
