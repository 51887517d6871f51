"""The guide's listing 004_01 (shared/seeds/004_*.txt, code block 1), as printed; only import lines differ."""
from streamrl.api import ToolAgentLoop, agent_state

class LongWorkflowAgent(ToolAgentLoop):
    async def _handle_generating_state(self, agent_data, sampling_params, ignore_termination=False):
        # call super() then change stop rules / add logging
        state = await super()._handle_generating_state(
            agent_data, sampling_params, ignore_termination=True
        )
        # e.g., cap at 15 assistant turns
        if agent_data.assistant_turns >= 15:
            return agent_state.AgentState.TERMINATED
        return state
