"""A graph without model calls, standing in for an agent: it keeps the conversation in the
thread's state, so each thread holds the subject's memory text like a real agent's would."""

import operator
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def reply(state: State) -> dict:
    last = state["messages"][-1] if state["messages"] else ""
    if last.startswith("take "):  # a run that takes that many seconds, as a model's may
        time.sleep(float(last.split()[1]))
    return {"messages": [f"noted: {last}"]}


builder = StateGraph(State)
builder.add_node("reply", reply)
builder.add_edge(START, "reply")
builder.add_edge("reply", END)
graph = builder.compile()
