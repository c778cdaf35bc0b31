"""Documents the tests build from the Apache-2.0 samples in tests/data: other color modes,
orientations, containers, and deliberately broken files."""

from __future__ import annotations

import io
import struct
import zlib

import pypdfium2 as pdfium
from PIL import Image

from tests.conftest import DATA


def phototest() -> Image.Image:
    """tesseract's phototest page (640 x 480, 1-bit) as RGB."""
    return Image.open(DATA / "phototest.tif").convert("RGB")


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    """``image`` saved as ``fmt`` into bytes."""
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def exif_rotated_jpeg() -> bytes:
    """phototest stored turned 90 degrees clockwise, with EXIF orientation 8 to turn it back."""
    stored = phototest().transpose(Image.Transpose.ROTATE_270)  # 480 x 640
    exif = Image.Exif()
    exif[0x0112] = 8  # "rotate 90 CW to display" (EXIF 2.3, tag 274)
    return encode(stored, "JPEG", quality=95, exif=exif)


def cmyk_jpeg() -> bytes:
    """phototest as a CMYK JPEG (Pillow writes Adobe-style inverted CMYK with an APP14 marker)."""
    return encode(phototest().convert("CMYK"), "JPEG", quality=95)


def pyramidal_tiff() -> bytes:
    """A TIFF with the full page and two reduced-resolution copies (NewSubfileType = 1)."""
    page = phototest()
    levels = [page.resize((page.width // k, page.height // k)) for k in (2, 4)]
    for level in levels:
        level.encoderinfo = {"tiffinfo": {254: 1}}
    return encode(page, "TIFF", save_all=True, append_images=levels)


def rotated_pdf() -> bytes:
    """A one-page PDF whose content is drawn sideways and put upright by ``/Rotate 90``."""
    sideways = phototest().transpose(Image.Transpose.ROTATE_90)  # 480 x 640
    pdf = pdfium.PdfDocument(encode(sideways, "PDF", resolution=72.0))
    pdf[0].set_rotation(90)
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def blank_pdf(pages: int, size_pt: tuple[float, float] = (612, 792)) -> bytes:
    """A PDF of ``pages`` empty pages, US letter unless ``size_pt`` (points) says otherwise."""
    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(*size_pt)
    buf = io.BytesIO()
    pdf.save(buf)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width x height`` RGB but whose data is a few bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = png_chunk(b"IDAT", zlib.compress(b"\0" * 16))
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + idat + png_chunk(b"IEND", b"")


def truncated_jpeg() -> bytes:
    """phototest as a JPEG cut off after 40% of its bytes."""
    data = encode(phototest(), "JPEG", quality=90)
    return data[: len(data) * 2 // 5]


def raw_pdf(*objects: bytes) -> bytes:
    """A PDF of the given objects (numbered from 1; object 1 must be the catalog) with a correct
    cross-reference table, for page trees no PDF writer would produce."""
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk with its length and CRC."""
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def blank_png(width: int, height: int, bit_depth: int = 8, color_type: int = 0) -> bytes:
    """A valid all-zero PNG of ``width x height`` (``color_type`` 0: gray, 2: RGB), compressed row by
    row so that a page of gigabytes is built in a second from a few hundred KB: a decompression
    bomb inside every limit but memory."""
    channels = {0: 1, 2: 3}[color_type]
    row = b"\0" * (1 + width * channels * bit_depth // 8)  # filter byte 0, then the samples
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")


def webp_header_bomb(width: int, height: int) -> bytes:
    """A tiny lossy WebP whose VP8 frame header (RFC 6386, 9.1: 14-bit width and height after the
    start code 9d 01 2a) is patched to declare ``width x height``."""
    data = bytearray(encode(Image.new("RGB", (16, 16), "white"), "WEBP", quality=50))
    start = data.index(b"\x9d\x01\x2a") + 3
    data[start : start + 4] = struct.pack("<HH", width & 0x3FFF, height & 0x3FFF)
    return bytes(data)


def pdf_q_bomb(operators: int, pages: int = 1, operator: bytes = b"q ") -> bytes:
    """A PDF of ``pages`` Letter pages that all draw one Flate-compressed content stream inflating
    to ``operators`` unbalanced ``q`` (save graphics state) operators, each costing the renderer a
    saved state (or ``operator``, e.g. ``b"q Q "``, repeated)."""
    packer = zlib.compressobj(9)
    chunk = operator * 100_000
    stream = b"".join(packer.compress(chunk) for _ in range(operators // 100_000)) + packer.flush()
    kids = " ".join(f"{3 + n} 0 R" for n in range(pages)).encode()
    content = 3 + pages
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>" % content
    return raw_pdf(
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        *[page] * pages,
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
    )
