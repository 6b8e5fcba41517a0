"""The built-in texts edgespec measures with on this machine, in one place (none from Spec-Bench, so a benchmark
never measures on what chose the settings): ``edgespec tune``'s calibration prompts, the default race's texts, the
layer-skip search's prompts, and the text a verify-cost curve is timed on."""

from __future__ import annotations

CALIBRATION_SET = "edgespec-tune/1 (built-in, not from Spec-Bench)"
CALIBRATION_PROMPTS = [
    "Rewrite this paragraph in the past tense, keeping everything else the same:\n\nThe committee meets every "
    "Tuesday in the old library. Each member brings a short report, and the chair reads the reports aloud. "
    "After the reading, the members vote on which projects receive funding for the next month.",
    "Add a docstring and type hints to this Python function and return the whole function:\n\n"
    "def moving_average(values, window):\n    result = []\n    for i in range(len(values) - window + 1):\n"
    "        result.append(sum(values[i:i + window]) / window)\n    return result\n",
    "Explain in a few sentences why the sky is blue.",
    "Summarize the following text in two sentences:\n\nSolar panels convert sunlight into electricity using "
    "photovoltaic cells. When light hits a cell, it knocks electrons loose, and the cell's electric field "
    "pushes them into a current. Panels are most efficient when they face the sun directly and stay cool.",
    "Write a short email to a colleague asking to move our Thursday meeting to Friday morning.",
    "List five fruits and, for each, one country where it is widely grown.",
]

# A chat's request holds the whole conversation, or a text pasted to work on: a default judged on short prompts
# alone would ignore the prefill a user waits for. So the race opens with a document (written for edgespec).
DOCUMENT = (
    "Read these notes from a town meeting and list the three decisions that were taken.\n\n"
    "The meeting opened at seven in the evening in the hall of the primary school, with forty-two residents "
    "present and the mayor in the chair. The first item was the state of the footbridge over the canal, which "
    "has been closed since the spring floods loosened two of its supports. An engineer from the regional office "
    "explained that the bridge could be repaired for about eighty thousand euros, or replaced by a wider bridge "
    "that would also carry bicycles for about two hundred thousand. Several residents pointed out that children "
    "now walk an extra kilometre along the main road to reach the school, and that the road has no pavement on "
    "its eastern side. After a long discussion the meeting voted to replace the bridge rather than repair it, on "
    "the condition that the regional government pays at least half of the cost, and asked the mayor to apply for "
    "the grant before the end of the month.\n\n"
    "The second item was the weekly market. The traders would like to move it from Saturday to Friday afternoon, "
    "because the larger market in the next town draws their customers away on Saturdays. The owners of the cafés "
    "on the square objected that a Friday market would block the terraces during their busiest hours. A trial "
    "was proposed: the market will be held on Friday afternoons from June to September, the stalls will keep to "
    "the northern half of the square, and the council will count visitors on both days before deciding for "
    "good. The trial was approved by a large majority.\n\n"
    "The third item concerned the old dairy on the river, empty for eleven years. A cooperative of young farmers "
    "has offered to rent it to make cheese and to open a small shop, and a developer has offered to buy it for "
    "apartments. The developer's offer would bring more money at once, but many residents said that the town "
    "needs work more than it needs apartments, and that the dairy's yard floods every few winters, which would "
    "make housing there a poor idea. The meeting agreed to rent the building to the cooperative for ten years at "
    "a low rent, with the cooperative paying for a new roof.\n\n"
    "Under any other business, a resident asked whether the street lights could be switched off after midnight to "
    "save energy; the mayor promised a study of the costs and of the views of the police. The meeting closed at "
    "a quarter to ten."
)

# the document, then chat, summary, code
RACE_PROMPTS = (DOCUMENT, CALIBRATION_PROMPTS[4], CALIBRATION_PROMPTS[3], CALIBRATION_PROMPTS[1])

# The layer-skip search's teacher-forced agreement is measured on these (`edgespec calibrate-skip`).
SEARCH_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works and when it is a poor choice.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "A train leaves at 9:40 and arrives at 13:05. How long is the journey? Explain step by step.",
    "Summarize the causes of the French Revolution in a few sentences.",
    "Translate into French: The weather is lovely today, let us walk to the market.",
)

# What a verify-cost curve is timed on (``Engine.calibrate``): any text does, as the cost does not depend on the words.
COST_TEXT = ("Speculative decoding lets a cheap drafter propose several tokens that the target model "
             "then verifies in a single batched forward pass. ") * 4
