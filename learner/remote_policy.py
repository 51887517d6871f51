"""The learner's model side when the model lives in a remote training service (trainer.type
remote_api_*): the same operations `learner.policy.Policy` offers the learner loop, done
through the official `tinker` client. No model is loaded here.

    train            the step's datums: forward_backward(loss_fn) then optim_step(Adam)
    write_version    save_weights_for_sampler, downloaded into the run's weight folder, so
                     the rollout engines load it as any weight version
    write_checkpoint save_state on the service (weights + optimizer); the local checkpoint
                     records its path with the step, offsets and TrainStep record

Resume: a restarted learner opens a training client from the newest checkpoint's service
state (with its optimizer) and carries on after that step, so no step is trained twice.
A lost connection is retried by the client with backoff, bounded by
`service.train_service.request_timeout_s`; past it the learner stops with one sentence.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from tenacity import Retrying, retry_if_exception, retry_if_exception_type, stop_after_attempt, stop_after_delay

from streamrl.learner.batching import TrainItem
from streamrl.learner.checkpoint import latest_checkpoint, load_state, save_checkpoint, version_folder
from streamrl.learner.parallel import Placement
from streamrl.learner.remote_trainers import RemoteApiTrainer, merged_metrics, request_chunks, service_datums
from streamrl.learner.single_process import SingleProcessPolicy
from streamrl.learner.trainer_factory import build_guide_trainer, unread_trainer_keys
from streamrl.learner.trainers import StepResult
from streamrl.learner.version_writes import VersionWrites
from streamrl.runtime.backoff import backoff_wait
from streamrl.runtime.config import Recipe
from streamrl.runtime.folders import write_folder
from streamrl.runtime.outage import ServiceLost

log = logging.getLogger("streamrl.remote")


RESUME = "then `streamrl run --resume RUN`"


def service_lost(url: str, what: str, error: BaseException, then: str = RESUME) -> ServiceLost:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ServiceLost(f"the training service at {url} {what} ({detail}): start it (`streamrl serve-training`), {then}.")


def wait_until_healthy(url: str, api_key: str | None, tries: int = 5, then: str = RESUME) -> None:
    """The service answers /healthz and accepts the key, or one sentence says which not."""
    retrying = Retrying(
        stop=stop_after_attempt(tries), wait=backoff_wait(0.5, 8.0), retry=retry_if_exception_type(httpx.HTTPError), reraise=True
    )
    try:
        for attempt in retrying:
            with attempt:
                response = httpx.post(
                    f"{url}/api/v1/client/config",
                    json={"sdk_version": "streamrl"},
                    headers={"X-API-Key": api_key or ""},
                    timeout=10,
                )
                if response.status_code in (401, 403):
                    raise ServiceLost(
                        f"the training service at {url} refused the API key "
                        "(service.tinker_service.api_key or $TINKER_API_KEY): "
                        f"{response.json().get('detail', response.text)}"
                    )
                response.raise_for_status()
    except httpx.HTTPError as error:
        raise service_lost(url, f"did not answer after {tries} tries", error, then) from None


class RemotePolicy(SingleProcessPolicy):
    def __init__(self, recipe: Recipe, trainer_class: type[RemoteApiTrainer], checkpoints: Path, run_id: str):
        import tinker  # imported here: two seconds that only a remote trainer pays

        self.recipe, self.checkpoints = recipe, checkpoints
        service = recipe.service.train_service
        self.url, self.timeout = (service.url or "").rstrip("/"), service.request_timeout_s  # a url: recipe validation
        self.api_key = recipe.service.tinker_service.api_key or os.environ.get("TINKER_API_KEY")
        self.placement = Placement(torch.device("cpu"))
        self.ref_model = None
        self.trainer = build_guide_trainer(trainer_class, recipe)
        self.loss_fn = service.config.loss_fn or trainer_class.loss_fn
        self.checkpoint = latest_checkpoint(checkpoints)
        self.val_saves = 0
        self.versions = VersionWrites()
        wait_until_healthy(self.url, self.api_key)
        self.service = tinker.ServiceClient(base_url=self.url, api_key=self.api_key, user_metadata={"streamrl_run": run_id})
        if self.checkpoint is not None:  # resume: the service's state of the newest checkpoint
            state_path = load_state(self.checkpoint)["service_state"]
            future = self.service.create_training_client_from_state_with_optimizer(state_path)
        else:
            base = service.base_model or recipe.rollout_worker.model_path or ""  # one of them: recipe validation
            future = self.service.create_lora_training_client(
                base_model=base, rank=recipe.service.tinker_service.lora_rank, seed=recipe.trainer.seed
            )
        self.client = self._result(future, "did not create the training client")
        self.model_id = self.client.model_id

    def _result(self, future, what: str):
        import tinker

        try:
            return future.result(timeout=self.timeout)
        except (tinker.APIConnectionError, TimeoutError) as error:
            raise service_lost(self.url, f"{what} within {self.timeout:.0f} s", error) from None

    # --- what the learner loop calls (learner/policy.py has the same names) ---------------------

    def warm_up(self) -> dict:
        """The recipe's cross-entropy warm-up, on the service: the same batches (drawn with
        trainer.seed) as the self-hosted warm-up, submitted ahead so none waits on the last."""
        from transformers import AutoTokenizer

        from streamrl.learner.warmup import demonstration_items, supervised_items
        from streamrl.runtime.chat_template import recipe_renderer
        from streamrl.runtime.dataset import read_rows, training_rows

        cfg, data = self.recipe.trainer, self.recipe.data
        if not cfg.warmup_cross_entropy_steps:
            return {"service_model": self.model_id}
        started, before = time.perf_counter(), self.val_accuracy()
        tokenizer = AutoTokenizer.from_pretrained(self.recipe.rollout_worker.model_path)
        if cfg.warmup_messages_key:
            rows = read_rows(data.data_files, data.type, (cfg.warmup_messages_key,))
            items = demonstration_items(rows, recipe_renderer(self.recipe, tokenizer), cfg.warmup_messages_key)
        else:
            rows = training_rows(data, (data.prompt_key, data.answer_key))
            items = supervised_items(rows, recipe_renderer(self.recipe, tokenizer), data.prompt_key, data.answer_key)
        rng = np.random.default_rng(cfg.seed)
        adam = self._adam(cfg.warmup_lr or cfg.lr)
        pending, losses = [], []
        for _ in range(cfg.warmup_cross_entropy_steps):
            batch = [items[i] for i in rng.integers(0, len(items), cfg.warmup_batch_size)]
            pending.append(
                (
                    self.client.forward_backward(self._datums(batch, "cross_entropy"), loss_fn="cross_entropy"),
                    self.client.optim_step(adam),
                )
            )
            if len(pending) >= 32:  # a bounded window of requests in flight
                losses += self._finish(pending)
        losses += self._finish(pending)
        # RL starts with a fresh optimizer, as on the self-hosted learner: reloading the
        # weights alone drops the warm-up's Adam moments (they would damp the first RL steps)
        saved = self._result(self.client.save_state("warmup"), "did not save the warmed-up state")
        self.client = self._result(
            self.service.create_training_client_from_state(saved.path), "did not load the warmed-up weights"
        )
        self.model_id = self.client.model_id
        return {
            "service_model": self.model_id,
            "val_accuracy_before_warmup": before,
            "val_accuracy_after_warmup": self.val_accuracy(),
            "warmup_steps": cfg.warmup_cross_entropy_steps,
            "warmup_first_loss": losses[0],
            "warmup_last_loss": float(np.mean(losses[-10:])),
            "warmup_seconds": time.perf_counter() - started,
        }

    def _finish(self, pending: list) -> list[float]:
        losses = [self._result(backward, "did not finish a warm-up step").metrics["loss:sum"] for backward, _ in pending]
        for _, step in pending:
            self._result(step, "did not finish a warm-up step")
        pending.clear()
        return losses

    def _datums(self, items: list[TrainItem], loss_fn: str) -> list:
        algorithm = self.recipe.algorithm
        return service_datums(items, loss_fn, algorithm.loss_agg_mode, algorithm.loss_scale_factor)

    def _adam(self, lr: float):
        from tinker import types

        config = self.recipe.service.train_service.config
        return types.AdamParams(
            learning_rate=lr,
            beta1=config.beta1,
            beta2=config.beta2,
            eps=config.eps,
            weight_decay=self.recipe.trainer.weight_decay,
            grad_clip_norm=self.recipe.trainer.grad_clip,
        )

    def val_accuracy(self) -> float:
        """Greedy exact-match accuracy on the validation rows, sampled by the service from
        the current weights (where the learner has no model: around the warm-up)."""
        from tinker import types
        from transformers import AutoTokenizer

        from streamrl.runtime.chat_template import recipe_renderer
        from streamrl.runtime.dataset import lookup, validation_rows

        val_cfg, worker = self.recipe.validate.data, self.recipe.rollout_worker
        if not val_cfg.data_files or worker.type != "single_turn" or worker.custom_rollout_worker_module_path:
            return float("nan")  # only the rollout workers know how other workers' tasks are done
        rows = validation_rows(val_cfg.data_files, val_cfg.type, val_cfg.max_rows)
        tokenizer = AutoTokenizer.from_pretrained(worker.model_path)
        self.val_saves += 1
        saved = self._result(self.client.save_weights_for_sampler(name=f"val-{self.val_saves}"), "did not save sampler weights")
        sampler = self._result(self.service.create_sampling_client(model_path=saved.path), "did not start sampling")
        params = types.SamplingParams(max_tokens=worker.max_response_length, temperature=0.0)
        renderer = recipe_renderer(self.recipe, tokenizer)
        futures = [
            sampler.sample(
                prompt=types.ModelInput.from_ints(renderer.prompt_ids(lookup(row, val_cfg.prompt_key))),
                num_samples=1,
                sampling_params=params,
            )
            for row in rows
        ]
        answers = [
            str(tokenizer.decode(self._result(f, "did not sample").sequences[0].tokens, skip_special_tokens=True))
            for f in futures
        ]
        truths = [str(lookup(row, self.recipe.data.answer_key)).strip() for row in rows]
        return float(np.mean([a.strip() == truth for a, truth in zip(answers, truths)]))

    def train(self, lr: float, items: list[TrainItem] | None = None) -> StepResult:
        started = time.perf_counter()
        items, metrics = self.trainer.prepare(items)
        algorithm = self.recipe.algorithm
        loss_config = (
            {"clip_low_threshold": 1.0 - algorithm.clip_ratio_low, "clip_high_threshold": 1.0 + algorithm.clip_ratio_high}
            if self.loss_fn in ("ppo", "cispo")
            else None
        )
        datums = self._datums(items, self.loss_fn)
        # requests of at most trainer.micro_batch_tokens tokens (a service bounds a request's
        # size); all submitted at once: the service runs them in order and sums their gradients
        chunks = request_chunks([len(item.tokens) for item in items], self.recipe.trainer.micro_batch_tokens)
        backwards = [
            self.client.forward_backward([datums[i] for i in chunk], loss_fn=self.loss_fn, loss_fn_config=loss_config)
            for chunk in chunks
        ]
        step = self.client.optim_step(self._adam(lr))
        outputs = [self._result(backward, "did not finish a forward_backward") for backward in backwards]
        optimized = self._result(step, "did not finish an optim_step")
        tokens = int(sum(item.mask[1:].sum() for item in items))
        summed = merged_metrics([o.metrics for o in outputs])
        remote = {f"service/{k}": float(v) for k, v in {**summed, **(optimized.metrics or {})}.items()}
        remote["service/forward_backward_requests"] = float(len(chunks))
        return StepResult(
            loss=float(summed.get("loss:sum", 0.0)),
            grad_norm=float((optimized.metrics or {}).get("grad_norm", 0.0)),
            tokens=tokens,
            samples=len(items),
            seconds=time.perf_counter() - started,
            metrics={**metrics, **remote},
        )

    def start_version(self, root: Path, version: int) -> None:
        """The service saves and serves the weights: written here, before the next step."""
        self.versions.done(version, self.write_version(root, version))

    def written_versions(self, wait: bool = False) -> list[tuple[int, Path]]:
        return self.versions.written(wait)

    def write_version(self, root: Path, version: int) -> Path:
        """The service's sampler weights of `version`, downloaded as a model folder."""
        saved = self._result(self.client.save_weights_for_sampler(name=f"v{version:06d}"), "did not save sampler weights")
        response = self._download(saved.path)
        root.mkdir(parents=True, exist_ok=True)

        def fill(folder: Path) -> None:
            with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
                tar.extractall(folder, filter="data")

        return write_folder(version_folder(root, version), fill)

    def _download(self, path: str) -> httpx.Response:
        """The sampler weights' tar; a lost connection or a 5xx is retried with a jittered
        doubling wait (at most 10 s) until `request_timeout_s` has passed."""

        def get() -> httpx.Response:
            response = httpx.get(
                f"{self.url}/streamrl/v1/sampler_weights",
                params={"path": path},
                headers={"X-API-Key": self.api_key or ""},
                timeout=self.timeout,
            )
            if response.status_code >= 500:
                raise httpx.HTTPStatusError(f"status {response.status_code}", request=response.request, response=response)
            response.raise_for_status()  # a 4xx: the request's fault, not retried
            return response

        def lost(error: BaseException) -> bool:
            return isinstance(error, httpx.TransportError) or (
                isinstance(error, httpx.HTTPStatusError) and error.response.status_code >= 500
            )

        retrying = Retrying(
            stop=stop_after_delay(self.timeout),
            wait=backoff_wait(0.5, 10.0),
            retry=retry_if_exception(lost),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "downloading %s: %s; retrying", path, state.outcome and state.outcome.exception()
            ),
        )
        try:
            return retrying(get)
        except httpx.HTTPError as error:
            if not lost(error):
                raise
            raise service_lost(self.url, f"did not send the weights {path} within {self.timeout:.0f} s", error) from None

    def write_checkpoint(self, step: int, state: dict, keep_every: int) -> None:
        saved = self._result(self.client.save_state(f"step-{step:06d}"), "did not save the training state")
        save_checkpoint(
            self.checkpoints,
            step,
            None,
            {"service_state": saved.path},
            {**state, "service_state": saved.path, "service_model": self.model_id},
            keep_every=keep_every,
        )

    def finish_checkpoint(self, wait: bool) -> bool:
        """The service's save_state has answered: nothing is left in flight."""
        return True

    def unread_config_keys(self) -> list[str]:
        return unread_trainer_keys(self.trainer, self.recipe)

    def fix_reference(self) -> None:
        raise RuntimeError("a remote trainer has no local KL reference (refused when the recipe is checked)")

    def close(self) -> None:
        try:  # ends the service session (its models stay restorable until then)
            self.service.close("success").result(timeout=30)
        except Exception as error:  # the run's outcome does not depend on it
            log.warning("closing the training-service session: %s", error)
