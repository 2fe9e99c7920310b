"""The `eyas train` stage: the optimisation loop, evaluation, logging, checkpoints and resume.

One optimizer step runs `grad_accum x world` micro-batches; every rank backpropagates the
*summed* TTT loss of its share, gradients are summed over ranks (one all-reduce, or FSDP's
reduce-scatter with `--fsdp`, see sharding.py) and divided by the number of loss-mask tokens of the
whole step, then clipped. So K processes and one process with K times the accumulation compute the
same update, and a short last step loses no sample.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.audit.contract import engine_api_problems
from eyas.config import TrainConfig
from eyas.data.dataset import read_manifest
from eyas.distributed import Ranks, all_reduce_gradients, all_reduce_sum, barrier, current_ranks, init_distributed, rank_device
from eyas.draft.layer_init import init_from_target_layer
from eyas.draft.model import load_draft, new_draft, set_embedding, write_draft
from eyas.draft.objective import StepScorer, StepSums, TeacherHead, loss_token_count, metrics_of
from eyas.errors import ChecksFailed, EyasError
from eyas.draft.config import WEIGHTS_FILE
from eyas.files import sha256_file, sha256_text
from eyas.precision import choose_dtype, machine_record
from eyas.progress import stage_progress
from eyas.stage import SUMMARY_FILE, JsonLines, Run, Stage
from eyas.models.argmax import TargetArgmax
from eyas.models.capture import FeatureCapture
from eyas.models.head import TargetHead, head_of, load_target_head, load_target_layer
from eyas.models.load import DTYPES, resolve_device
from eyas.train import batches as B
from eyas.train.checkpoint import (
    CHECKPOINTS, TrainerState, list_checkpoints, load_checkpoint, optimizer_tensors, prune_checkpoints, save_checkpoint,
)
from eyas.train.sharding import TTTLoss, full_tensor, gathered_state, local, parameter_counts, shard
from eyas.train.setup import TrainSetup, resolve_train, vocab_tensors
from eyas.train.sources import OnlineSource, SampleSource, StoreSource

METRICS = "metrics.jsonl"
NO_STORED_ARGMAX = ("extracted before eyas stored the target's argmax: computing it over the {vocab:,}-token vocabulary "
                    "once per sample, the first time each is read, and keeping it for the run (the first epoch runs at "
                    "the old rate, the later ones do not); `eyas extract --overwrite` stores it")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    final: dict[str, float]
    eval: dict[str, float] | None
    reused: bool


TRAIN = Stage("train", "an eyas training run", (CHECKPOINTS, "final", "best", METRICS, SUMMARY_FILE, "tensorboard"),
              keyed=(f"{CHECKPOINTS}/*/trainer.json", SUMMARY_FILE))


def _identities(config: TrainConfig, setup: TrainSetup, world: int) -> dict[str, object]:
    """Return what, besides the deciding config fields, decides the run's weights."""
    return {
        "global_batch": config.grad_accum * world,  # micro-batches per step over all ranks: resumable on another rank count
        "target": setup.draft_config.target.id if setup.draft_config.target else None,
        "store": setup.store.run_key if setup.store else None,
        "dataset": read_manifest(setup.dataset_dir).fingerprint,  # online: the store key does not cover it
        "vocab": sha256_text(",".join(map(str, setup.vocab.d2t.tolist()))),  # re-prepared vocab, same fingerprint
        "init": sha256_file(config.init / WEIGHTS_FILE) if config.init else None,
    }


def lr_factor(step: int, total: int, warmup: int, floor: float) -> float:
    """Return the learning-rate multiplier at `step`: linear warmup, then cosine down to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def ttt_depth(step: int, total: int, steps: int, growth: float) -> int:
    """Return the unroll depth of optimizer step `step` (1-based) of `total`: 1 at the start, one deeper at each
    `1/steps` of the first `growth` share of the run, `steps` from there on (and throughout with growth 0)."""
    span = growth * total
    if span <= 0:
        return steps
    return min(steps, 1 + int((step - 1) / span * steps))


class _Trainer:
    def __init__(self, config: TrainConfig, setup: TrainSetup, ranks: Ranks, device: torch.device,
                 run_key: str) -> None:
        self.config, self.setup, self.ranks, self.device, self.run_key = config, setup, ranks, device, run_key
        self.capture: FeatureCapture | None = None
        head_dtype = DTYPES[config.target_dtype] if device.type == "cuda" else torch.float32
        self.source, head = self._source_and_head(head_dtype)
        d2t, t2d = vocab_tensors(setup.vocab)
        token_ids = torch.arange(len(d2t)) + d2t  # [N] target ids of the draft vocabulary
        self.teacher = TeacherHead(head.final_norm, head.lm_head, token_ids.to(head.lm_head.device), head.softcap)
        torch.manual_seed(config.seed)
        if config.init is not None:
            self.draft = load_draft(config.init)
        else:
            self.draft = new_draft(setup.draft_config)
            with torch.no_grad():  # start the head where the target's is: its rows of the draft vocabulary
                self.draft.lm_head.weight.copy_(head.lm_head[token_ids.to(head.lm_head.device)].float())
            if config.init_layer is not None:
                weights = self._target_layer(config.init_layer)
                for number, layer in enumerate(self.draft.layers):
                    init_from_target_layer(layer, weights, f"init_layer {config.init_layer} (draft layer {number})")
        self.draft.config = setup.draft_config
        self.draft.d2t.copy_(d2t)
        self.draft.t2d.copy_(t2d)
        set_embedding(self.draft, head.embed.float())
        self.draft.to(device)
        self.model = TTTLoss(self.draft, config.ttt_steps, autocast=config.dtype == "bfloat16")
        self.sharded = config.fsdp and ranks.distributed
        if self.sharded:
            shard(self.model, device, ranks.world)
        self.params = [p for p in self.draft.parameters() if p.requires_grad]  # after sharding: DTensors then
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=(0.9, 0.95),
                                           weight_decay=config.weight_decay)
        lengths = self.source.lengths()
        self.lengths = lengths
        self.train_ids, self.eval_ids = B.split_indices(len(lengths), config.eval_fraction, config.seed)
        if len(self.train_ids) == 0:
            raise EyasError("train: no training samples (the dataset is empty)")
        self.per_step = config.grad_accum * ranks.world
        self._plans: dict[int, list[B.MicroBatch]] = {}
        self.steps_per_epoch = B.steps_in(len(self.plan(0)), self.per_step)
        self.total = config.max_steps or config.epochs * self.steps_per_epoch
        self.warmup = int(config.warmup_fraction * self.total)

    def _source_and_head(self, head_dtype: torch.dtype) -> tuple[SampleSource, TargetHead]:
        """Return where samples come from and the target's head. Every sample carries the target's argmax: the
        store's; one computed once per sample for a store made without it (said once); online, the head's."""
        config, setup = self.config, self.setup
        if not setup.online:
            head = load_target_head(setup.target, head_dtype, str(self.device), config.trust_remote_code)
            argmax = None
            if setup.store.teacher_argmax is None:  # type: ignore[union-attr]
                argmax = TargetArgmax(head.final_norm, head.lm_head)
                if self.ranks.rank == 0:
                    print(f"eyas: {config.features}: {NO_STORED_ARGMAX.format(vocab=argmax.vocab_size)}", file=sys.stderr)
            return StoreSource(config.features, setup.store, argmax), head  # type: ignore[arg-type]
        from eyas.data.dataset import DatasetReader
        from eyas.models.load import load_target

        parts = load_target(setup.target, DTYPES[config.target_dtype], str(self.device), config.trust_remote_code)
        self.capture = FeatureCapture(parts, setup.draft_config.aux_layer_ids).__enter__()
        head = head_of(parts)
        source = OnlineSource(DatasetReader(setup.dataset_dir), self.capture, config.token_budget, str(self.device),
                              TargetArgmax(head.final_norm, head.lm_head))
        return source, head

    def _target_layer(self, index: int) -> dict[str, torch.Tensor]:
        """Return the tensors of target decoder layer `index`: from the loaded target online, else read."""
        if self.capture is not None:
            return {name: t.detach() for name, t in self.capture.parts.layers[index].state_dict().items()}
        return load_target_layer(self.setup.target, index, torch.float32, self.config.trust_remote_code)

    def close(self) -> None:
        """Remove the online capture hooks from the target."""
        if self.capture is not None:
            self.capture.__exit__(None, None, None)

    def plan(self, epoch: int) -> list[B.MicroBatch]:
        """Return the micro-batches of `epoch` (the current epoch's plan is kept)."""
        if epoch not in self._plans:
            self._plans = {epoch: B.plan_epoch(self.train_ids, self.lengths, self.config.seed, epoch,
                                               self.config.row_tokens, self.config.token_budget)}
        return self._plans[epoch]

    def _batch(self, micro: B.MicroBatch) -> B.PackedBatch:
        samples = self.source.samples([i for row in micro for i in row])
        return B.collate([[samples[i] for i in row] for row in micro]).to(self.device)

    def _objective(self, batch: B.PackedBatch) -> tuple[StepScorer, torch.Tensor]:
        """Return the scorer (holding the step sums) and the summed weighted objective of `batch`."""
        teacher = self.teacher(batch.last, batch.argmax)
        scorer = StepScorer(teacher, batch.doc_ids, batch.loss_mask, self.draft.d2t, self.draft.t2d,
                            self.config.ttt_steps, self.config.out_of_vocab)
        return scorer, self.model(batch, scorer)

    def share(self, plan: list[B.MicroBatch], first: int, count: int) -> tuple[list[B.MicroBatch], list[B.MicroBatch]]:
        """Return this rank's micro-batches of `plan[first:first+count]`, and the zero-weight ones it runs
        so that every rank makes as many FSDP calls (none without `--fsdp`)."""
        chunk = plan[first:first + count]
        mine = chunk[self.ranks.rank::self.ranks.world]
        rounds = math.ceil(len(chunk) / self.ranks.world) if self.sharded else len(mine)
        return mine, chunk[:1] * (rounds - len(mine))

    def train_step(self, step: int, micro_batches: list[B.MicroBatch], padding: list[B.MicroBatch]
                   ) -> tuple[StepSums, float, int, float]:
        """Run optimizer step `step` (1-based); return its sums, loss-token count, tokens and gradient norm (all ranks).

        Refuses (on every rank) a non-finite loss or gradient norm before the update, and an update
        that made a weight non-finite, so no checkpoint, best/ or final/ ever holds such weights.
        """
        self.model.train()
        self.model.steps = ttt_depth(step, self.total, self.config.ttt_steps, self.config.ttt_growth)
        self.optimizer.zero_grad(set_to_none=True)
        sums, loss_tokens, tokens = StepSums.zeros(self.config.ttt_steps), 0, 0
        for micro in micro_batches:
            batch = self._batch(micro)
            scorer, objective = self._objective(batch)
            objective.backward()
            sums = sums + scorer.sums
            loss_tokens += loss_token_count(batch.doc_ids, batch.loss_mask)
            tokens += batch.tokens
        for micro in padding:
            (0.0 * self._objective(self._batch(micro))[1]).backward()
        if not self.sharded:
            all_reduce_gradients(self.params, self.ranks)
        counts = all_reduce_sum(torch.tensor([loss_tokens, tokens], dtype=torch.float64), self.ranks)
        stacked = all_reduce_sum(sums.stacked(), self.ranks)
        for param in self.params:
            if param.grad is not None:
                param.grad.div_(max(counts[0].item(), 1.0))
        norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)))
        step_sums = StepSums.from_stacked(stacked)
        loss = metrics_of(step_sums, counts[0].item())["loss"]
        if not (math.isfinite(loss) and math.isfinite(norm)):
            raise _not_finite(step, f"loss {loss}, gradient norm {norm}", "before applying the update")
        self.optimizer.step()
        if not self._weights_finite():
            raise _not_finite(step, f"the update made draft weights non-finite (loss {loss:.4g}, gradient norm "
                                    f"{norm:.4g})", "before saving them")
        return step_sums, counts[0].item(), int(counts[1].item()), norm

    def _weights_finite(self) -> bool:
        """Return whether every trainable draft weight is finite on every rank (one all-reduce)."""
        bad = sum(not bool(torch.isfinite(local(p.detach())).all()) for p in self.params)
        return all_reduce_sum(torch.tensor([float(bad)], dtype=torch.float64), self.ranks).item() == 0

    @torch.no_grad()
    def evaluate(self) -> dict[str, float] | None:
        """Return the metrics over the held-out split (None without one)."""
        if len(self.eval_ids) == 0:
            return None
        self.model.eval()
        self.model.steps = self.config.ttt_steps  # held-out figures always score the whole unroll
        plan = B.plan_epoch(self.eval_ids, self.lengths, self.config.seed, 0, self.config.row_tokens,
                            self.config.token_budget, shuffle=False)
        sums, loss_tokens = StepSums.zeros(self.config.ttt_steps), 0
        mine, padding = self.share(plan, 0, len(plan))
        for micro in mine:
            batch = self._batch(micro)
            scorer, _ = self._objective(batch)
            sums = sums + scorer.sums
            loss_tokens += loss_token_count(batch.doc_ids, batch.loss_mask)
        for micro in padding:
            self._objective(self._batch(micro))
        stacked = all_reduce_sum(sums.stacked(), self.ranks)
        total = all_reduce_sum(torch.tensor([float(loss_tokens)], dtype=torch.float64), self.ranks)
        return metrics_of(StepSums.from_stacked(stacked), total.item())

    def set_lr(self, step: int) -> float:
        lr = self.config.lr * lr_factor(step, self.total, self.warmup, self.config.min_lr_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr


def _not_finite(step: int, what: str, when: str) -> EyasError:
    """Return the error that stops training at optimizer `step` on a non-finite value."""
    return EyasError(f"train: optimizer step {step}: {what}; stopped {when}: the checkpoints and best/ keep the last "
                     "good weights; lower --lr or check the inputs")


def _trim_metrics(metrics: JsonLines, last_step: int) -> None:
    """Keep the metric lines up to `last_step` (a resumed run rewrites what came after its checkpoint)."""
    records = metrics.read()
    metrics.keep(next((n for n, record in enumerate(records) if record["step"] > last_step), len(records)))


class _MetricsLog:
    """`metrics.jsonl` (one JSON object per line, written whole) and TensorBoard when it is installed."""

    def __init__(self, run: Run, enabled: bool) -> None:
        self.enabled = enabled
        self.handle = run.lines(METRICS).appender() if enabled else None
        self.board = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.board = SummaryWriter(str(run.path / "tensorboard"))
            except ImportError:
                pass

    def write(self, record: dict[str, object]) -> None:
        if not self.handle:
            return
        self.handle.append(json.dumps(record, sort_keys=True))
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, float):
                    self.board.add_scalar(f"{record['split']}/{key}", value, int(record["step"]))  # type: ignore[arg-type]

    def close(self) -> None:
        if self.handle:
            self.handle.close()
        if self.board is not None:
            self.board.close()


def run_train(config: TrainConfig) -> TrainResult:
    """Train (or resume, or reuse) the run in `config.out`; return where it ended.

    Everything that can be checked without weights is checked first (inputs belong together,
    output directory free or this run's). Resumes from the newest checkpoint of the same run.
    """
    ranks = current_ranks()
    setup = resolve_train(config)
    if setup.online and config.preflight:
        problems, _ = engine_api_problems()
        if problems:
            raise ChecksFailed(f"preflight found {len(problems)} problem(s): " + " | ".join(problems))
    device_name = rank_device(ranks, resolve_device(config.device))
    init_distributed(ranks, device_name)
    precisions = {"dtype": choose_dtype(config.dtype, device_name),
                  "target_dtype": choose_dtype(config.target_dtype, device_name, config.target)}
    config = config.model_copy(update={field: choice.dtype for field, choice in precisions.items()})
    out = config.out
    notes = tuple(choice.note(field) for field, choice in precisions.items())
    run = TRAIN.claim(config, _identities(config, setup, ranks.world), notes, primary=ranks.rank == 0)
    run_key = run.key
    if ranks.rank == 0:
        if config.resume and not (run.resumed and (list_checkpoints(out) or run.read_summary())):
            raise EyasError(f"{out}: --resume: no checkpoint of this run to resume from")
        precisions["dtype"].announce("train dtype (draft autocast)")
        precisions["target_dtype"].announce("train target_dtype")
    barrier(ranks)
    if (summary := run.read_summary()) is not None:
        return TrainResult(out, summary["steps"], summary["final"], summary["eval"], True)

    trainer = _Trainer(config, setup, ranks, torch.device(device_name), run_key)
    state = TrainerState(run_key=run_key, step=0, epoch=0, step_in_epoch=0, tokens=0)
    window = StepSums.zeros(config.ttt_steps)
    window_tokens = 0.0
    checkpoints = list_checkpoints(out)
    if checkpoints:
        state = load_checkpoint(checkpoints[-1], trainer.draft, trainer.optimizer)
        window = StepSums.from_stacked(torch.tensor(state.window, dtype=torch.float64))
        window_tokens = state.window_loss_tokens
    if ranks.rank == 0:
        _trim_metrics(run.lines(METRICS), state.step)
    log = _MetricsLog(run, ranks.rank == 0)
    started, tokens_at_start = time.monotonic(), state.tokens
    last_train, last_eval = state.last_train, state.last_eval
    try:
        with stage_progress() as bar:
            task = bar.add_task("train", total=trainer.total, completed=state.step, rate="")
            while state.step < trainer.total:
                plan = trainer.plan(state.epoch)
                lr = trainer.set_lr(state.step)
                share, padding = trainer.share(plan, state.step_in_epoch * trainer.per_step, trainer.per_step)
                sums, loss_tokens, tokens, grad_norm = trainer.train_step(state.step + 1, share, padding)
                window, window_tokens = window + sums, window_tokens + loss_tokens
                state.step += 1
                state.tokens += tokens
                state.step_in_epoch += 1
                if state.step_in_epoch >= B.steps_in(len(plan), trainer.per_step):
                    state.epoch, state.step_in_epoch = state.epoch + 1, 0
                rate = (state.tokens - tokens_at_start) / max(time.monotonic() - started, 1e-9)
                metrics = last_train = metrics_of(window, window_tokens)
                bar.update(task, completed=state.step, rate=f"{rate:,.0f} tok/s  loss {metrics['loss']:.3f}  "
                                                             f"acc0 {metrics['acc_0']:.2f}  tau {metrics['implied_tau']:.2f}")
                last = state.step == trainer.total
                if state.step % config.log_every == 0 or last:
                    log.write({"split": "train", "step": state.step, "epoch": state.epoch, "tokens": state.tokens,
                               "lr": lr, "grad_norm": grad_norm, "tokens_per_s": rate, "ttt_depth": trainer.model.steps,
                               **metrics})
                    window, window_tokens = StepSums.zeros(config.ttt_steps), 0.0
                if state.step % config.eval_every == 0 or last:
                    last_eval = trainer.evaluate()
                    if last_eval is not None and not math.isfinite(last_eval["loss"]):
                        raise _not_finite(state.step, f"held-out loss {last_eval['loss']}", "before saving its weights")
                    score = (last_eval or metrics)["implied_tau"]
                    if last_eval is not None:
                        log.write({"split": "eval", "step": state.step, **last_eval})
                    if state.best_tau is None or score > state.best_tau:
                        state.best_step, state.best_tau = state.step, score
                        weights = gathered_state(trainer.draft)
                        if ranks.rank == 0:
                            write_draft(setup.draft_config, weights, out / "best")
                if state.step % config.save_every == 0 or last:
                    state.window, state.window_loss_tokens = window.stacked().tolist(), window_tokens
                    state.last_train, state.last_eval = last_train, last_eval
                    weights, moments = gathered_state(trainer.draft), optimizer_tensors(trainer.draft, trainer.optimizer)
                    if ranks.rank == 0:
                        save_checkpoint(out, setup.draft_config, weights, moments, state)
                        prune_checkpoints(out, config.keep_last, state.best_step)
                    barrier(ranks)
    finally:
        log.close()
        trainer.close()
    weights = gathered_state(trainer.draft)
    if ranks.rank == 0:
        write_draft(setup.draft_config, weights, out / "final")
        run.write_summary({"steps": state.step, "final": last_train, "eval": last_eval,
                                          "best_step": state.best_step, "best_implied_tau": state.best_tau,
                                          "ranks": ranks.world, "fsdp": trainer.sharded, **parameter_counts(trainer.draft),
                                          "precision": {field: choice.record() for field, choice in precisions.items()},
                                          "machine": machine_record()})
    barrier(ranks)
    return TrainResult(out, state.step, last_train, last_eval, False)
