"""A generated slice of customer-service calls for the embedded reply model: a caller asks
about an order, books, cancels or changes something, reports a fault, a login problem, a
charge or a late delivery, complains, asks when or where, or just says "yeah". The
assistant answers the way a phone agent does: it names what the caller named, says sorry
where that fits, and asks the one question it needs next.

The corpora the model is trained on (chit-chat, and SGD's travel, events and restaurant
dialogues) have no such calls, so the model answered "I forgot my password again." with
"Do you want to hear the song?". Each group below pairs caller frames with slot values and
replies that echo the slot (`{x}`), so the model learns to carry the caller's noun into its
answer rather than one fixed string per group. Written from the categories a phone
assistant meets (issue 22: requests, greetings, questions, complaints, small talk,
goodbyes), not from the bench's caller lines; `service_pairs` drops any caller line whose
words are in one of them or hold one (`bench/data/caller_*.txt`), so the held-out bench
stays held out.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llm.pair import Pair

BENCH_LINES = Path(__file__).resolve().parents[1] / "bench" / "data"


@dataclass(frozen=True)
class Group:
    frames: tuple[str, ...]  # caller lines; "{x}" takes a slot value
    replies: tuple[str, ...]  # the assistant's; "{x}" echoes the caller's slot value
    slots: tuple[str, ...] = ("",)
    tails: tuple[str, ...] = ("",)  # appended to a caller line ("for Friday", "please")
    openers: bool = True  # "hi, ", "um, " ... before a caller line


_ABOUT = Group(
    frames=("I'm calling about my {x}", "it's about my {x}", "I have a question about my {x}",
            "I need some help with my {x}", "I'm ringing about my {x}", "can you help me with my {x}",
            "I want to ask about my {x}"),
    slots=("order", "delivery", "booking", "reservation", "appointment", "bill", "account", "refund",
           "subscription", "parcel", "payment", "contract", "claim", "prescription", "ticket", "membership"),
    replies=("Of course, I can help with your {x}. What's the reference number?",
             "Sure. What would you like to know about your {x}?",
             "I can look into your {x} for you. What name is it under?",
             "No problem. What seems to be the problem with your {x}?"),
)
_BOOK = Group(
    frames=("I'd like to book {x}", "can I book {x}", "I need to book {x}", "could you book me {x}",
            "is it possible to book {x}", "I want to book {x}"),
    slots=("a table", "an appointment", "a room", "a taxi", "a test drive", "a delivery slot", "a consultation",
           "a haircut", "a class", "a service for my car", "a check-up"),
    tails=("", " for Friday", " for tomorrow", " for next week", " for this evening", " for Monday morning",
           " please"),
    replies=("Of course. What time would suit you best?",
             "Sure, I can book {x} for you. Can I take your name, please?",
             "Happy to help. Can I have your name and a phone number?",
             "Let me check what we have. How many people is it for?"),
)
_CANCEL = Group(
    frames=("I want to cancel my {x}", "I need to cancel my {x}", "please cancel my {x}", "can you cancel my {x}",
            "how do I cancel my {x}", "I'd like to cancel my {x}"),
    slots=("order", "booking", "reservation", "appointment", "subscription", "membership", "plan", "delivery",
           "contract", "account"),
    replies=("I can help you cancel your {x}. Can I take your name, please?",
             "Okay. Can you give me the details of the {x} you want to cancel?",
             "I'm sorry to see you go. Can I ask why you want to cancel your {x}?",
             "Sure. Before I cancel your {x}, can you confirm your full name?"),
)
_CHANGE = Group(
    frames=("I need to change my {x}", "can I change my {x}", "I'd like to update my {x}", "I want to change my {x}",
            "how do I update my {x}", "could you change my {x}"),
    slots=("address", "phone number", "email address", "booking", "appointment", "order", "payment details",
           "plan", "delivery date", "name on the account"),
    replies=("Sure, I can change your {x}. What would you like it changed to?",
             "Of course. Before I update your {x}, can you confirm your name?",
             "No problem. I just need to check a few details first. What's your account number?"),
)
_FAULT = Group(
    frames=("my {x} isn't working", "my {x} stopped working", "my {x} is broken", "there's a problem with my {x}",
            "I'm having trouble with my {x}", "something is wrong with my {x}"),
    slots=("internet", "phone", "card", "laptop", "heating", "boiler", "router", "app", "television",
           "washing machine", "fridge", "printer", "smart meter"),
    replies=("I'm sorry to hear that. When did your {x} stop working?",
             "I'm sorry about the trouble with your {x}. Can you tell me what happens when you use it?",
             "I'm sorry about that. Let's get your {x} sorted. Can you describe the problem?",
             "That sounds frustrating. Is your {x} showing any error message?"),
)
_LOGIN = Group(
    frames=("I forgot my password", "I can't log in", "I'm locked out of my account", "my password doesn't work",
            "I can't get into my account", "the app won't let me sign in", "I need to reset my password",
            "I never got the reset email", "it keeps saying my password is wrong", "I can't remember my username",
            "I forgot my password again", "I can't log in on the website", "I can't log in on my phone"),
    replies=("No problem. I can send you a link to reset your password. What's the email address on your account?",
             "I'm sorry about that. I can help you get back into your account. What's your username?",
             "Let's sort that out. Can you confirm the email address you signed up with?"),
)
_MONEY = Group(
    frames=("I was charged twice", "there's a charge I don't recognise", "I want a refund", "I'd like my money back",
            "my bill is much higher than usual", "I think I've been overcharged", "I still haven't had my refund",
            "I paid but it says I still owe money", "you took the payment twice", "I was charged twice this month",
            "I was charged twice for the same thing", "there's a charge on my card from last week"),
    replies=("I'm sorry about that. Let me look into it. Which payment are you asking about?",
             "I understand. Can you tell me the date and the amount of the payment?",
             "I'm sorry for the trouble. I can check that for you. What's your account number?"),
)
_LATE = Group(
    frames=("my parcel hasn't arrived", "where is my order", "my delivery is late", "I'm still waiting for my package",
            "the courier never came", "my order still hasn't shown up", "it says delivered but I haven't got it",
            "I've been waiting for my delivery all day", "my parcel hasn't arrived yet",
            "my delivery is late and it was due yesterday", "my order is late and nobody has told me anything"),
    replies=("I'm sorry that it hasn't arrived yet. Do you have the order number so I can track it?",
             "I'm sorry about the wait. Let me check where it is. What's your order number?",
             "That's not good. Can you give me the tracking number, please?"),
)
_COMPLAIN = Group(
    frames=("I'm not happy with the service", "I want to make a complaint", "nobody ever calls me back",
            "I'm really fed up with this", "the service has been terrible", "I've been on hold for ages",
            "I was promised a call back and it never happened", "this is the fourth time I've rung",
            "I'm very disappointed", "this keeps happening", "I'm not happy with the service to be honest",
            "the service has been terrible and I want it sorted"),
    replies=("I'm sorry that you've had this experience. Can you tell me what happened?",
             "I understand, and I apologize. Let me see what I can do to put it right.",
             "I'm really sorry about that. I'll make sure this gets sorted. What is it about?"),
)
_WHEN_WHERE = Group(
    frames=("what time do you open", "when do you close", "are you open at the weekend", "what are your opening hours",
            "where are you based", "how do I find you", "are you open on bank holidays", "how late are you open",
            "what time do you close today", "are you open tomorrow", "how late are you open this week"),
    replies=("I can check that for you. Which branch are you asking about?",
             "Good question. Which location do you mean?",
             "Let me find that for you. Which of our branches is it?"),
)
_WHAT = Group(
    frames=("how much does it cost", "how long will it take", "do you deliver", "can I pay by card",
            "do you have it in stock", "is there a charge for that", "do you do gift cards", "is it available now",
            "do you have it in stock at the moment"),
    replies=("It depends on what you need. Could you tell me a bit more?",
             "Let me check that for you. What exactly are you looking for?",
             "I can find that out. Which product are you asking about?"),
)
_YES = Group(
    frames=("yeah", "yes please", "sure", "alright", "yep", "sounds good", "go on then", "that's fine", "yes"),
    replies=("Great. What would you like to do next?",
             "Alright. How else can I help you today?"),
    openers=False,
)
_NO = Group(
    frames=("no thanks", "not really", "nope", "no", "no, not today", "I don't think so"),
    replies=("Okay. Can I help you with anything else?",
             "No problem. Is there something else you need?"),
    openers=False,
)
_CALLBACK = Group(
    frames=("can someone call me back", "could you ring me back later", "please call me back tomorrow",
            "can I get a call back", "I'd like someone to phone me"),
    replies=("Of course. What's the best number to reach you on?",
             "Sure. When is a good time for us to call you?"),
)
_SMALL = Group(
    frames=("it's been a busy day", "sorry I'm in the car", "sorry about the noise", "what a lovely day",
            "sorry I'm a bit distracted", "sorry the kids are shouting", "it's freezing today"),
    replies=("No problem. What can I do for you today?",
             "That's quite alright. How can I help?",
             "That's fine. What are you calling about?"),
)

GROUPS: tuple[Group, ...] = (_ABOUT, _BOOK, _CANCEL, _CHANGE, _FAULT, _LOGIN, _MONEY, _LATE, _COMPLAIN,
                             _WHEN_WHERE, _WHAT, _YES, _NO, _CALLBACK, _SMALL)
_OPENERS = ("", "", "", "hi, ", "hello, ", "um, ", "yeah, ", "so ", "hi there, ", "oh hi, ", "right, ")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9' ]+", "", text.lower()).strip()


def bench_lines() -> set[str]:
    """The bench's caller lines, normalised: never trained on."""
    out: set[str] = set()
    for f in sorted(BENCH_LINES.glob("caller_*.txt")):
        out |= {_norm(line) for line in f.read_text().splitlines() if line.strip()}
    return out


def _caller(core: str, openers: bool, rng: random.Random) -> str:
    text = (rng.choice(_OPENERS) if openers else "") + core
    if rng.random() < 0.7:
        text = text[0].upper() + text[1:]
    question = text.split(",")[-1].split()[0].lower() in {
        "can", "could", "where", "what", "when", "how", "is", "are", "do"}
    r = rng.random()
    if r < 0.6:
        text += "?" if question else "."
    elif r < 0.7 and not question:
        text += "!"
    return text


def _near_bench(core: str, held: set[str]) -> bool:
    """A caller line's words (no opener) inside a bench line, or a bench line of three words
    or more inside them: too close to train on."""
    c = _norm(core)
    return any(c in h or (h.count(" ") >= 2 and h in c) for h in held)


def all_replies() -> Iterable[str]:
    """Every reply the slice can pair with a caller line (for the grammar check)."""
    for g in GROUPS:
        for slot in g.slots:
            for reply in g.replies:
                yield reply.replace("{x}", slot)


def service_pairs(seed: int = 0, per_group: int = 400) -> list[Pair]:
    """``per_group`` caller -> assistant pairs from each group, drawn with ``seed``. A caller
    line whose words are in a bench line, or hold one, is left out (`_near_bench`)."""
    rng = random.Random(seed)
    held = bench_lines()
    near: dict[str, bool] = {}
    out = []
    for g in GROUPS:
        for _ in range(per_group):
            slot, tail = rng.choice(g.slots), rng.choice(g.tails)
            core = rng.choice(g.frames).replace("{x}", slot) + tail
            caller = _caller(core, g.openers, rng)
            if core not in near:
                near[core] = _near_bench(core, held)
            if near[core]:
                continue
            out.append(Pair(caller, rng.choice(g.replies).replace("{x}", slot), "service"))
    return out
