"""The passes of a run over the units, each spread over the engine's workers and
each put back in the plan's order: the duplicates (--dedup), the tokenizer's sample
(--train-tokenizer), then the units' files. The counts are summed in unit order."""

from __future__ import annotations

import hashlib
import sys
import time
from contextlib import contextmanager
from dataclasses import replace

from msgen.data import resume
from msgen.data.counts import MAX_WARNINGS, Counts, SetCounts
from msgen.data.summary import skipped_warning
from msgen.data.work import Job, file_name

DIGEST = 16  # bytes of a document's hash (work.digest_of)
SAMPLE_BYTES = 1 << 30  # input a trained tokenizer learns from, at most about
SAMPLE_CHARACTERS = 4 << 30  # and text: a .gz inflates


class Run:
    def __init__(self, options, units, progress, seq: int, vocab: int):
        self.options, self.units, self.progress = options, units, progress
        self.seq, self.vocab = seq, vocab
        self.workers = options.worker_count
        self.eos = self.tokenizer_bytes = None
        self.resumed = self.tokens = 0
        self.seconds = 0.0
        self.pool = None

    @contextmanager
    def engine(self):
        from msgen.data.engines import LocalEngine

        if self.options.engine == "ray":
            from msgen.data.ray_engine import RayEngine

            self.pool = RayEngine(self.workers, self.options.ray_address)
        else:
            self.pool = LocalEngine(self.workers)
        try:
            yield self.pool
        finally:
            self.pool.close()

    def ordered(self, kind: str, job: Job, tokenizer_json, tasks, phase: str):
        """Each task's result, in the plan's order (results that finish early wait)."""
        self.progress.phase(phase)
        waiting, position, at = {}, 0, 0
        order = [task[0].index for task in tasks]
        for unit, result in self.pool.map(kind, job, tokenizer_json, tasks):
            position += unit.size
            self.progress.update(position, units=1)
            waiting[unit.index] = result
            while at < len(order) and order[at] in waiting:
                yield order[at], waiting.pop(order[at])
                at += 1

    def duplicates(self, job: Job) -> dict[int, frozenset[int]]:
        """For each unit, the ordinals of its documents whose text an earlier
        document of the dataset (in input order) already has."""
        seen: set[bytes] = set()
        drops = {}
        tasks = [(u, None, frozenset()) for u in self.units]
        for index, digests in self.ordered("hash", job, None, tasks, "finding duplicates in"):
            drop = []
            for i in range(len(digests) // DIGEST):
                digest = digests[i * DIGEST : (i + 1) * DIGEST]
                if digest in seen:
                    drop.append(i)
                else:
                    seen.add(digest)
            drops[index] = frozenset(drop)
        return drops

    def train(self, job: Job, drops):
        """A byte-level BPE learned from the training documents of a sample chosen by
        their hashes (all of them when the input is under SAMPLE_BYTES), fed in
        input order."""
        from msgen.data import tokenizer as tok

        fraction = min(1.0, SAMPLE_BYTES / max(sum(u.size for u in self.units), 1))
        tasks = [(u, fraction, drops.get(u.index, frozenset())) for u in self.units]
        chars = 0

        def texts():
            nonlocal chars
            for _, sample in self.ordered("sample", job, None, tasks, "sampling for the tokenizer"):
                for text in sample:
                    if chars < SAMPLE_CHARACTERS:
                        chars += len(text)
                        yield text

        trained = tok.train(texts(), self.vocab)
        tok.plain_text(trained, "the trained tokenizer")
        return trained

    def all(self, stage, folder, outputs, tokenizer, tokenizer_bytes, eos):
        """Every pass; the summed counts, each set's counts, the files of each set in
        dataset order, and the digest of every file written."""
        from msgen.data import tokenizer as tok

        options = self.options
        job = Job(stage.path, tuple(outputs), self.seq, options.overlap, options.normalize,
                  options.valid)  # fmt: skip
        began = time.monotonic()
        drops = self.duplicates(job) if options.dedup else {}
        if options.train_tokenizer:
            tokenizer = self.train(job, drops)
            tokenizer_bytes = tokenizer.to_str(pretty=True).encode("utf-8")
            eos = (tok.TRAINED_EOS, tokenizer.token_to_id(tok.TRAINED_EOS))
            (stage.path / "tokenizer.json").write_bytes(tokenizer_bytes)
        self.eos, self.tokenizer_bytes = eos, tokenizer_bytes
        sha = hashlib.sha256(tokenizer_bytes).hexdigest()
        job = replace(job, eos_id=eos[1], tokenizer_sha=sha)
        made_by = resume.fingerprint(
            job=[job.outputs, job.seq, job.overlap, job.normalize, job.valid, job.eos_id, sha],
            field=options.field, paragraphs=options.paragraphs, unit_size=options.unit_size,
        )  # fmt: skip
        keys = {
            u.index: resume.unit_key(u, made_by, drops.get(u.index, frozenset()))
            for u in self.units
        }
        results = resume.done(self.units, keys, stage.path, folder) if options.resume else {}
        self.resumed = len(results)
        tasks = [
            (u, keys[u.index], drops.get(u.index, frozenset()))
            for u in self.units
            if u.index not in results
        ]
        self.progress.phase("tokenizing")
        self.progress.update(sum(u.size for u in self.units if u.index in results),
                             units=len(results))  # fmt: skip
        position, shown = self.progress.bytes, 0
        tokenizer_json = tokenizer_bytes.decode("utf-8")
        for unit, result in self.pool.map("run", job, tokenizer_json, tasks):
            results[unit.index] = result
            for item in result.counts.shown[: MAX_WARNINGS - shown]:
                sys.stderr.write(skipped_warning(item, options.error_format))
            shown += len(result.counts.shown[: MAX_WARNINGS - shown])
            position += unit.size
            tokens = sum(s.tokens for s in result.sets.values())
            self.tokens += tokens
            self.progress.update(position, result.counts.documents, tokens, units=1)
        self.seconds = time.monotonic() - began
        return merged(self.units, results, outputs, self.seq)

    def summary(self) -> list[str]:
        pool = self.pool
        where = "Ray" if pool.name == "ray" else "this machine"
        lines = [
            f"{len(self.units):,} unit{'s' * (len(self.units) > 1)} on {self.workers} worker{'s' * (self.workers > 1)} ({where}), "
            f"{self.seconds:,.1f} s, {self.tokens / max(self.seconds, 1e-9) / 1e6:,.2f} M "
            "tokens/s"
            + (f"; {self.resumed:,} units were done before (--resume)" if self.resumed else "")
        ]
        if pool.name == "ray":
            lines.append(
                f"Ray's start-up: {pool.startup:,.1f} s (Ray {pool.ray_startup:,.1f} s, then its "
                f"{pool.count} workers' imports; not in the time above)"
            )
        return lines


def merged(units, results, outputs, seq: int):
    counts = Counts()
    sets = {name: SetCounts(name, seq + 1) for name in outputs}
    files: dict[str, list[str]] = {name: [] for name in outputs}
    digests: dict[str, str] = {}
    for unit in units:
        result = results[unit.index]
        counts.add(result.counts)
        for name in outputs:
            sets[name].add(result.sets[name])
            if file_name(name, unit.index) in result.files:
                files[name].append(file_name(name, unit.index))
        digests |= result.files
    return counts, sets, files, digests
