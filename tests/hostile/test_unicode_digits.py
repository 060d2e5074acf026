"""Digits that are not ASCII: "²".isdigit() holds and int("²") raises, so every place that
checks a string with isdigit() before int() or float() must also ask isascii(). Each of these
reads a string from outside (an S3 key or ETag, a webhook's Retry-After, a failure's error
class, a rendezvous endpoint, a resize value): a superscript must be refused, never a crash."""

from __future__ import annotations

import pytest

from agents.artifacts.verify import multipart_count
from agents.queue.layout import CHUNK_DIGITS, chunk_of_key
from agents.rundir.control import ControlError, parse_resize_value
from console.failures import class_label
from trainer.nodewatch import split_endpoint

ODD = "²"


def test_unicode_digits_are_refused_not_crashed_on() -> None:
    assert chunk_of_key("campaign/commits/" + ODD * CHUNK_DIGITS) is None
    assert chunk_of_key("campaign/commits/" + "7" * CHUNK_DIGITS) == int("7" * CHUNK_DIGITS)
    assert multipart_count("abc-" + ODD) is None and multipart_count("abc-3") == 3
    with pytest.raises(ControlError, match="whole number"):
        parse_resize_value(ODD)
    assert parse_resize_value("12") == 12
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_endpoint("node-1:" + ODD)
    assert split_endpoint("node-1:29500") == ("node-1", 29500)
    assert class_label("failed", "http_" + ODD) != "HTTP " + ODD
    assert class_label("failed", "http_503") == "HTTP 503"
