"""The fixed text the tiny tokenizer is trained on: plain English and a little code, written for this project."""

from __future__ import annotations

CORPUS = (
    r"""
The quick brown fox jumps over the lazy dog. The dog does not mind, and the fox runs on.
A small model is a good model for a test: it loads in a second and it fails in a second.
We build the model in code, with fixed seeds, so every run writes the same bytes to disk.
The weights are random, but the layout is the layout of the real checkpoint, name for name.
Quantization turns sixteen bit weights into four bit integers, one scale for every group.
A group holds one hundred and twenty eight weights of one row, and they share a single scale.
The server reads the packed weights and the scales, and it multiplies them back on the fly.
Speculative decoding lets a small draft head guess the next tokens; the target model checks them.
When the guess is right, the server keeps the token and saves a step. When it is wrong, it throws it away.
The draft head here is one extra layer on top of the model, and it shares the output head.
Hello, world! How are you today? I am fine, thank you, and how is the weather where you are?
It is sunny in the morning, cloudy at noon, and it rains a little in the evening.
She opened the window, looked at the garden, and counted the birds on the old wall.
There were seven birds, then eight, then the cat came out and there were none at all.
He wrote a letter to his sister, folded it twice, and walked to the post office in the rain.
The river runs through the town, under three bridges, past the mill and the market square.
On Monday the market sells bread, cheese, apples, pears, honey, and fresh green beans.
Numbers are easy: one, two, three, four, five, six, seven, eight, nine, ten, 11, 12, 2026.
Please read the manual before you start the machine, and keep your hands away from the belt.
If the light turns red, stop the machine, write down the error, and call the person on duty.
The answer is forty two. The question is longer, and nobody remembers what it was.
A good test says what a user sees: the exit code, the message, the files on disk and their hashes.
Every file is written to a temporary name first, then renamed, so no one sees half a file.
The manifest lists every file with its size and its digest, sorted by path.
The cache keeps the last thousand requests, and the oldest one leaves when a new one arrives.
I think, therefore I am. You think, therefore you are. We think, therefore we test.
The library opens at nine and closes at five, except on Sunday, when it does not open at all.
To make tea, boil the water, warm the pot, add the leaves, wait three minutes, and pour.
The train to the city leaves at seven fifteen from platform two and arrives at eight.
def add(a, b):
    return a + b

def greet(name: str) -> str:
    return f"Hello, {name}!"

class Counter:
    def __init__(self) -> None:
        self.count = 0

    def step(self, by: int = 1) -> int:
        self.count += by
        return self.count

for i in range(10):
    if i % 2 == 0:
        print(i, "is even")
    else:
        print(i, "is odd")

import json
from pathlib import Path

def load(path: Path) -> dict:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)

result = {"name": "tiny", "layers": 4, "hidden": 256, "ok": True}
values = [x * x for x in range(8) if x > 2]
total = sum(values) / len(values)
while total > 1.0:
    total = total / 2
print("done", total)

SELECT name, size FROM files WHERE size > 1024 ORDER BY name;
git commit -m "Add the tiny model builder" && git push origin main
$ python -m pip install --upgrade pip
{"role": "user", "content": "What is the capital of France?"}
{"role": "assistant", "content": "The capital of France is Paris."}
User: Can you tell me a short story?
Assistant: Once upon a time, a little robot learned to count. It counted stars, stones and sheep, and then it slept.
User: What time is it?
Assistant: I do not have a clock, but it is always a good time to write a test.
The colors of the rainbow are red, orange, yellow, green, blue, indigo and violet.
Water freezes at zero degrees and boils at one hundred degrees at sea level.
The earth goes around the sun once a year, and the moon goes around the earth once a month.
Mathematics: 3 + 4 = 7, 6 * 7 = 42, 10 / 4 = 2.5, 2 ** 10 = 1024, and the square root of 81 is 9.
The meeting is moved to Thursday afternoon; please bring the report and the numbers from last week.
Thank you for your message. I will reply as soon as I can, most likely tomorrow morning.
Small steps, taken every day, go a long way. Big steps, taken once, often go nowhere.
Images and videos reach the model as patches; a vision tower turns them into tokens for the text model.
""".strip()
    + "\n"
)
