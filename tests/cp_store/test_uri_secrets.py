"""Credentials in a store URI are never printed, whatever characters the secret holds.

AWS secret keys often hold ``/``; users paste them into URIs unencoded. Secrets are generated
over the whole printable alphabet (whitespace aside) and put in URIs; what ``redact`` prints,
what ``resolve`` and ``read_records`` raise, must never hold them.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cp_common.printable import redact, scrub
from cp_sink import read_records
from cp_store.location import StoreError, resolve

ALPHABET = "".join(c for c in string.printable if not c.isspace())
# A secret of 8 characters or more: a shorter one could be part of the bucket or path by chance.
SECRETS = st.text(alphabet=ALPHABET, min_size=8, max_size=48)
LOCAL_S3 = "endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"  # no network at resolve


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=SECRETS, scheme=st.sampled_from(["s3", "s3a", "gs"]))
def test_redact_keeps_the_place_and_drops_any_secret(secret: str, scheme: str) -> None:
    uri = f"{scheme}://AKIDEXAMPLE:{secret}@results/runs/records?{LOCAL_S3}"
    shown = redact(uri)
    assert shown == f"{scheme}://results/runs/records?{LOCAL_S3}"


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=SECRETS)
def test_resolve_never_puts_the_secret_in_its_error(secret: str) -> None:
    uri = f"s3a://AKIDEXAMPLE:{secret}@results/runs/records?{LOCAL_S3}"
    try:
        loc = resolve(uri)
    except StoreError as e:  # pyarrow refuses many of these URIs, quoting the URI it was given
        said = str(e).replace(f"results/runs/records?{LOCAL_S3}", "")  # the secret may be a part of it
        assert secret not in said and "://results/runs/records?" in str(e)
    else:
        assert loc.uri == f"s3://results/runs/records?{LOCAL_S3}" and loc.path == "results/runs/records"


@pytest.mark.parametrize(
    "secret", ["SeCrEt/abc+def", "SE#CRET-tail", "SE?CRET=x&y", "[SECRET-bracket", "SE/CR@ET/a@b"]
)
def test_an_unencoded_secret_is_refused_in_one_line_naming_the_fix(secret: str) -> None:
    uri = f"s3a://AKIDEXAMPLE:{secret}@results/records"
    for call in (resolve, read_records):
        with pytest.raises((StoreError, ValueError)) as e:
            call(uri)
        text = str(e.value)
        assert secret not in text and "\n" not in text and "://results/records" in text
        assert "percent-encode" in text


def test_what_is_not_user_info_is_kept() -> None:
    assert redact("s3://bucket/dir/file@v2.parquet") == "s3://bucket/dir/file@v2.parquet"
    assert redact("hdfs://namenode:8020/runs/a@b") == "hdfs://namenode:8020/runs/a@b"
    assert redact("hdfs://alice@namenode:8020/runs") == "hdfs://namenode:8020/runs"
    assert redact("/tmp/runs/a@b:c") == "/tmp/runs/a@b:c"
    assert redact("s3://b/r?secret_key=x#frag") == "s3://b/r?secret_key=***#frag"
    # After credentials holding an unencoded '/', the last '@' before a host wins: never the secret.
    assert redact("s3://AK:SE/CR@ET@bucket/key") == "s3://bucket/key"


def test_a_store_message_quoting_the_uri_is_scrubbed_of_its_credentials() -> None:
    raw = "s3://AKID:Se%2FCr%40et@results/records"
    said = "Cannot parse URI: 's3://AKID:Se%2FCr%40et@results/records' or Se/Cr@et, AKID:Se/Cr@et"
    assert scrub(said, raw) == "Cannot parse URI: 's3://***@results/records' or ***, ***"


def test_a_file_workload_on_a_store_is_named_without_its_credentials() -> None:
    from cp_source.reader.options import check_ndjson_file

    with pytest.raises(ValueError) as e:  # the URI is refused: its error and the option's hint name it
        check_ndjson_file("s3://AKIDEXAMPLE:SeCrEt/abc@results/missing.ndjson")
    assert "SeCrEt" not in str(e.value) and "workload=file:s3://results/missing.ndjson" in str(e.value)
