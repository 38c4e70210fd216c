"""SIP bridge signalling units: message parsing, SDP offer/answer and digest authentication."""

from __future__ import annotations

import hashlib

import pytest

from voice.transports.sip import sdp
from voice.transports.sip.digest import DigestAuth, parse_credentials
from voice.transports.sip.message import (
    SipParseError,
    parse,
    parse_cseq,
    parse_name_addr,
    parse_uri,
    parse_via,
    response,
    split_list,
)
from voice.transports.sip.server import _stamp_via, _validate

INVITE = (
    "INVITE sip:agent@127.0.0.1:5070 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKabc;rport, SIP/2.0/UDP proxy.example:5060;branch=z9hG4bKp\r\n"
    "v: SIP/2.0/UDP far.example;branch=z9hG4bKfar\r\n"
    'f: "Ann, the caller" <sip:ann@example.com>;tag=1928\r\n'
    "t: <sip:agent@127.0.0.1>\r\n"
    "i: a84b4c76e66710@pc33\r\n"
    "CSeq: 314159 INVITE\r\n"
    "Subject: a folded\r\n  header value\r\n"
    "c: application/sdp\r\n"
    "l: 4\r\n"
    "\r\n"
    "v=0\r\nextra"
)


def test_parse_request_with_compact_forms_folding_and_lists():
    msg = parse(INVITE.encode())
    assert msg.method == "INVITE" and msg.problem is None
    assert msg.get("Subject") == "a folded header value"
    assert len(msg.get_all("Via")) == 3
    assert parse_name_addr(msg.get("From") or "").tag == "1928"
    assert msg.get("Call-ID") == "a84b4c76e66710@pc33"
    assert msg.body == b"v=0\r"  # Content-Length wins over the rest of the datagram
    assert _validate(msg) is None


@pytest.mark.parametrize(
    "data,problem",
    [
        (INVITE.replace("l: 4", "l: 400"), "truncated"),
        (INVITE.replace("l: 4", "l: -1"), "Content-Length"),
        (INVITE.replace("l: 4\r\n", "l: 4\r\nContent-Length: 4\r\n"), "Content-Length"),
        (INVITE.split("\r\n\r\n")[0][:-40], "end of headers"),
        (INVITE.replace("CSeq: 314159 INVITE", "CSeq: x INVITE\r\nbroken line"), "malformed header"),
    ],
)
def test_recoverable_defects_are_flagged_for_a_400(data, problem):
    msg = parse(data.encode())
    assert msg.problem is not None and problem in msg.problem
    assert _validate(msg)[0] == 400


@pytest.mark.parametrize(
    "data", [b"", b"\r\n\r\n", b"hello", b"\xff\xfe INVITE", b"INVITE sip:x\r\n\r\n", b"SIP/2.0 99 Low\r\n\r\n",
             b"INVITE  SIP/2.0\r\n\r\n", b"X" * 70_000]
)  # fmt: skip
def test_garbage_is_not_a_sip_message(data):
    with pytest.raises(SipParseError):
        parse(data)


@pytest.mark.parametrize(
    "edit,status",
    [
        (("CSeq: 314159 INVITE", "CSeq: 314159 BYE"), 400),
        (("CSeq: 314159 INVITE", "CSeq: 99999999999 INVITE"), 400),
        (("i: a84b4c76e66710@pc33\r\n", ""), 400),
        (("SIP/2.0\r\nVia", "SIP/3.0\r\nVia"), 505),
        (("sip:agent@127.0.0.1:5070", "tel:+15551234"), 416),
        (("CSeq: 314159", "Max-Forwards: 0\r\nCSeq: 314159"), 483),
        (("CSeq: 314159", "Max-Forwards: lots\r\nCSeq: 314159"), 400),
        (('f: "Ann, the caller" <sip:ann@example.com>;tag=1928', "f: <sip:ann@example.com"), 400),
    ],
)
def test_validation_picks_the_right_status(edit, status):
    msg = parse(INVITE.replace(*edit).encode())
    assert _validate(msg)[0] == status


def test_header_value_helpers():
    via = parse_via("SIP/2.0/UDP [::1]:5060;branch=z9hG4bK1;rport")
    assert (via.host, via.port, via.branch) == ("::1", 5060, "z9hG4bK1")
    assert parse_uri("sip:bob@example.com:5080;transport=udp").port == 5080
    assert parse_cseq("12 ack") == (12, "ACK")
    assert split_list('"a, b" <sip:x>, <sip:y;p=1,2>') == ['"a, b" <sip:x>', "<sip:y;p=1,2>"]
    assert parse_name_addr("sip:bob@example.com;tag=9").tag == "9"
    with pytest.raises(ValueError):
        parse_via("SIP/2.0/UDP host:99999")


def test_response_echoes_the_dialog_headers_and_stamps_via():
    req = parse(INVITE.encode())
    resp = response(req, 180, to_tag="xyz")
    assert parse_name_addr(resp.get("To") or "").tag == "xyz"
    assert resp.get_all("Via") == req.get_all("Via")
    top = _stamp_via(resp.get("Via") or "", ("192.0.2.7", 40000))
    assert top.startswith("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKabc;rport=40000;received=192.0.2.7,")
    raw = parse(resp.to_bytes())
    assert raw.status == 180 and raw.get("Content-Length") == "0"


# --- SDP ---


def _offer(fmts: str, extra: str = "", conn: str = "c=IN IP4 10.0.0.1") -> sdp.Session:
    return sdp.parse(
        f"v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\n{conn}\r\nt=0 0\r\n"
        f"m=video 5000 RTP/AVP 96\r\nm=audio 4000 RTP/AVP {fmts}\r\n"
        "a=rtpmap:101 telephone-event/8000\r\na=rtpmap:96 opus/48000/2\r\na=rtpmap:97 PCMU/8000\r\n" + extra
    )


def test_answer_follows_the_callers_codec_order_and_keeps_media_lines():
    local = sdp.LocalSdp("127.0.0.1", 30000)
    plan, body = local.answer(_offer("96 8 0 101"))
    assert (plan.codec.name, plan.payload_type, plan.dtmf_payload_type) == ("PCMA", 8, 101)
    assert (plan.remote_ip, plan.remote_port, plan.direction) == ("10.0.0.1", 4000, "sendrecv")
    lines = body.splitlines()
    assert "m=video 0 RTP/AVP 96" in lines  # rejected, but kept in place (RFC 3264 6)
    assert "m=audio 30000 RTP/AVP 8 101" in lines
    plan, _ = local.answer(_offer("97 8"))  # a dynamic payload type named PCMU
    assert (plan.codec.name, plan.payload_type, plan.dtmf_payload_type) == ("PCMU", 97, None)


def test_no_common_codec_is_not_acceptable():
    with pytest.raises(sdp.NotAcceptable):
        sdp.LocalSdp("127.0.0.1", 30000).answer(_offer("96 18"))
    with pytest.raises(sdp.NotAcceptable):
        sdp.LocalSdp("127.0.0.1", 30000, ("PCMU",)).answer(_offer("8"))


def test_hold_offers_get_the_mirrored_direction_and_stop_our_sending():
    local = sdp.LocalSdp("127.0.0.1", 30000)
    plan, body1 = local.answer(_offer("0", "a=sendonly\r\n"))
    assert plan.direction == "recvonly" and plan.on_hold and "a=recvonly" in body1
    plan, _ = local.answer(_offer("0", "a=inactive\r\n"))
    assert plan.direction == "inactive" and plan.on_hold
    plan, _ = local.answer(_offer("0", conn="c=IN IP4 0.0.0.0"))  # RFC 2543 hold
    assert plan.on_hold
    plan, body2 = local.answer(_offer("0"))
    assert not plan.on_hold
    version = [int(b.splitlines()[1].split()[2]) for b in (body1, body2)]
    assert version[1] > version[0]  # the description changed, so the o= version went up


@pytest.mark.parametrize(
    "text",
    ["", "v=1\r\n", "v=0\r\ns=-\r\nm=audio 1 RTP/AVP 0\r\n", "v=0\r\no=x\r\nm=audio 99999 RTP/AVP 0\r\n",
     "v=0\r\no=x\r\nc=IN IP4\r\nm=audio 1 RTP/AVP 0\r\n", "v=0\r\no=x\r\nm=audio 1 RTP/AVP 0\r\na=rtpmap:0 PCMU\r\n",
     "v=0\r\no=x\r\nxx\r\n", "v=0\r\no=x\r\n"],
)  # fmt: skip
def test_bad_sdp_is_rejected(text):
    with pytest.raises(sdp.SdpError):
        sdp.parse(text)


def test_delayed_offer_round_trip():
    local = sdp.LocalSdp("127.0.0.1", 30000, ("PCMA", "PCMU"))
    offer = sdp.parse(local.offer())
    assert offer.media[0].formats == ["8", "0", "101"]
    answer = "v=0\r\no=- 2 2 IN IP4 10.0.0.2\r\ns=-\r\nc=IN IP4 10.0.0.2\r\nt=0 0\r\nm=audio 4002 RTP/AVP 0 101\r\n"
    plan = local.accept_answer(sdp.parse(answer))
    assert (plan.codec.name, plan.remote_port, plan.dtmf_payload_type) == ("PCMU", 4002, 101)


# --- digest ---


def _md5(s: str) -> str:
    return hashlib.md5(s.encode()).hexdigest()


def _authorization(challenge: str, user: str, password: str, uri: str = "sip:agent@127.0.0.1") -> str:
    p = parse_credentials(challenge)
    ha1, ha2 = _md5(f"{user}:{p['realm']}:{password}"), _md5(f"INVITE:{uri}")
    resp = _md5(f"{ha1}:{p['nonce']}:00000001:0a4f113b:auth:{ha2}")
    return (f'Digest username="{user}", realm="{p["realm"]}", nonce="{p["nonce"]}", uri="{uri}", '
            f'response="{resp}", algorithm=MD5, qop=auth, nc=00000001, cnonce="0a4f113b"')  # fmt: skip


def test_digest_accepts_the_right_password_only():
    now = [1000.0]
    auth = DigestAuth("alice", "s3cret", "voice-agent", now=lambda: now[0])
    challenge = auth.challenge()
    assert auth.check("INVITE", _authorization(challenge, "alice", "s3cret")).ok
    assert not auth.check("INVITE", _authorization(challenge, "alice", "wrong")).ok
    assert not auth.check("INVITE", _authorization(challenge, "mallory", "s3cret")).ok
    assert not auth.check("INVITE", None).ok
    assert not auth.check("INVITE", "Basic YWxpY2U6czNjcmV0").ok
    forged = challenge.replace('nonce="', 'nonce="1')
    assert not auth.check("INVITE", _authorization(forged, "alice", "s3cret")).ok
    now[0] += 3600
    stale = auth.check("INVITE", _authorization(challenge, "alice", "s3cret"))
    assert not stale.ok and stale.stale and "stale=true" in auth.challenge(stale=True)
