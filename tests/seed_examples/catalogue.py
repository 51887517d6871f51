"""Every Python code block of the guide (`shared/seeds/FFF_*.txt`, numbered in order), and
what happens to it here. `RUN` blocks are in `listings/sFFF_NN.py` as printed (only their
import lines differ) and run in the test named; `NOT_RUN` blocks say why no
implementation could run them as printed. tests/test_seed_listings.py checks this file
against the guide and the listings against their blocks."""

RUN = {
    # chapter "Creating Custom Rollout Workers"
    "000_01": "test_worker_listings",  # MySimpleWorker
    "000_02": "test_agent_worker_listings",  # MyAgentWorker (NexAU type 2)
    "000_03": "test_worker_listings",  # MultiStepWorker
    "000_04": "test_worker_listings",  # TemplateWorker
    "000_05": "test_worker_listings",  # ToolIntegratedWorker
    "000_06": "test_agent_worker_listings",  # CustomTokenWorker
    "000_07": "test_worker_listings",  # ConditionalWorker
    "000_08": "test_agent_worker_listings",  # a workspace module imported by a worker
    "000_09": "test_worker_listings",  # error handling in rollout
    "000_11": "test_worker_listings",  # MyWorker's own config keys
    "000_12": "test_worker_listings",  # the worker unit test
    "000_13": "test_worker_listings",  # utils.extract_xml_tag
    # "NexRL User Guide for Algorithm Developers"
    "001_01": "test_evaluator_listings",  # MyEvaluator (short)
    "001_02": "test_agent_worker_listings",  # MyTaskWorker.format_task_query
    "001_03": "test_agent_worker_listings",  # MyTaskWorker.get_train_loss_mask
    "001_04": "test_agent_worker_listings",  # ComplexTaskWorker (self.agent, self.client, tracer)
    "001_05": "test_evaluator_listings",  # MyEvaluator (full)
    "001_06": "test_evaluator_listings",  # ExtractorEvaluator
    "001_07": "test_evaluator_listings",  # MultiCriteriaEvaluator
    "001_08": "test_llm_judge_listing",  # LLMJudgeEvaluator, against an OpenAI-compatible server
    "001_09": "test_trainer_listings",  # MyCustomTrainer (values["advantages"])
    "001_11": "test_trainer_listings",  # MyRemoteTrainer (custom features)
    "001_12": "test_trainer_listings",  # _prepare_trajectories with GRPO
    "001_14": "test_agent_worker_listings",  # MultiTurnWorker
    "001_15": "test_evaluator_listings",  # CodeGenEvaluator
    "001_16": "test_evaluator_listings",  # ReasoningWorker + ReasoningEvaluator
    "001_18": "test_evaluator_listings",  # the evaluator tested standalone
    # "Recipe Development"
    "002_01": "test_evaluator_listings",  # MyTaskEvaluator
    "002_02": "test_evaluator_listings",  # FuzzyMatchEvaluator
    "002_03": "test_agent_worker_listings",  # MyTaskWorker (context + question)
    "002_04": "test_agent_worker_listings",  # MyTaskWorker (is_final mask)
    "002_05": "test_data_listings",  # training data to parquet
    "002_06": "test_data_listings",  # validate_data
    "002_07": "test_evaluator_listings",  # test_evaluator
    # "Custom Trainers"
    "003_01": "test_trainer_listings",  # pattern 1
    "003_02": "test_trainer_listings",  # pattern 2
    "003_03": "test_trainer_listings",  # the algorithm module
    "003_04": "test_trainer_listings",  # pattern 3, with its relative import
    "003_05": "test_trainer_listings",  # KL penalty
    "003_07": "test_trainer_listings",  # n-step returns
    "003_09": "test_trainer_listings",  # metrics from _prepare_batch
    "003_10": "test_trainer_listings",  # the edge-case advantage helper
    "003_12": "test_trainer_listings",  # the trainer unit test
    # the multi-turn note (verl's extension points)
    "004_01": "test_multi_turn_note_listing",  # LongWorkflowAgent(ToolAgentLoop), capped at 15 turns
}

NOT_RUN = {
    "000_10": "four logging statements lifted from a rollout: `task` and `reward` are that rollout's locals",
    "000_14": "a rollout that reads a local `prompt` it never assigns (NameError in any implementation)",
    "000_15": "a Trajectory(...) expression over a rollout's locals (tokens, loss_mask, reward, result, answer)",
    "000_16": "a BAD/GOOD contrast of lines, with a `return` outside a function",
    "000_17": "a BAD/GOOD contrast over undefined prompt_tokens / response_tokens",
    "000_18": "a BAD/GOOD contrast defining rollout twice over an undefined _create_trajectory",
    "001_10": "NexRL's own module registry (StreamRL registers trainers with @register_trainer or a file.py:Class)",
    "001_13": "an outline: remove_redundant_left_padding(...) and _apply_kl_penalty(batch, ...) take `...` "
              "for their arguments (SelfHostedGrpoTrainer is the runnable form, tested in test_trainer_listings)",
    "001_17": "logging statements over a worker's locals (task, query, output)",
    "001_19": "a statement from inside a worker (value, count, current_step are its locals); "
              "experiment_logger_post itself is tested in test_worker_listings",
    "002_08": "a tool class whose execute calls self._process, which it never defines",
    "003_06": "calls self._value_network.predict(...): the guide defines no value network, and StreamRL's "
              "algorithms (GRPO family) have none",
    "003_08": "a list of Batch field names, not Python",
    "003_11": "import lines and two statements over a trainer's locals (batch, trajectories, metrics)",
    "003_13": "an outline with `...` arguments, over a trainer's locals",
    "003_14": "statements over a trainer's locals (trajectories, metrics, logger)",
}
