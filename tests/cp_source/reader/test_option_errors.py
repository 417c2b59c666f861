"""The reader's option errors quote what the user wrote: a known option in its documented spelling,
its value as given, and for an unknown name the nearest valid one."""

from __future__ import annotations

import pytest

from cp_source.reader.options import ReaderOptions


def _error(options: dict[str, str]) -> str:
    with pytest.raises(ValueError) as e:
        ReaderOptions.parse(options)
    return str(e.value)


def test_a_near_miss_name_gets_did_you_mean() -> None:
    msg = _error({"maxrecordpertrigger": "5", "segmentsperpartiton": "2"})
    assert msg.startswith(
        "unknown options for the cloudprofiler source: 'maxrecordpertrigger', did you mean "
        "'maxRecordsPerTrigger'?; 'segmentsperpartiton', did you mean 'segmentsPerPartition'? "
        "(names as Spark passes them, lower-cased; valid: endpoint, "
    )
    assert _error({"Qwerty": "1"}).startswith(
        "unknown option for the cloudprofiler source: 'Qwerty' (valid: "
    )


def test_values_are_quoted_as_given_and_options_as_documented() -> None:
    # Spark passes names lower-cased: the message names the option as the docs spell it
    assert _error({"startingoffsets": "Latest-ish"}) == (
        "option startingOffsets='Latest-ish': expected one of earliest, latest"
    )
    assert _error({"factory": "Embeded"}) == "option factory='Embeded': expected one of embedded, external"
    assert _error({"maxspoolbytes": "12x"}) == "option maxSpoolBytes='12x': expected an integer"
    assert ReaderOptions.parse({"FACTORY": " External "}).factory == "external"  # any case still parses
