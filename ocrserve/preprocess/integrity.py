"""Image data that ends before the image does: refused, not filled in.

A decoder that runs out of data may fill the rest of the image silently: libjpeg pads a scan cut
short at a marker with zero coefficients (a JPEG whose header was patched from 600 x 200 to
20000 x 7500 decoded to a grey page at the declared size), and Pillow's PNG decoder stops at the
end of a zlib stream that holds fewer rows than the header declares (the rest stays black). Each
check here reads only the file's structure and raises :class:`~ocrserve.errors.UnsupportedMedia`
(415, slug ``truncated``) whose detail starts "image data ends early", as a cut file's decoder
error is reported (:data:`TRUNCATED`).
"""

from __future__ import annotations

import math
import struct
import zlib

from PIL import Image

from ocrserve.errors import UnsupportedMedia

#: What every problem of this module's kind says first.
TRUNCATED = "image data ends early"
#: Fewest bits of entropy-coded data one 8 x 8 block of a Huffman-coded JPEG takes: a sequential
#: scan codes each block's DC difference and its end of block (at least one bit each); a
#: progressive one codes each block's DC in the first scan (at least one bit) and may skip the
#: rest with end-of-band runs (ITU-T T.81, F.1.2 and G.1.2). Arithmetic coding has no such floor.
MIN_BITS_PER_BLOCK = 1
#: JPEG start-of-frame markers of arithmetic coding (SOF9-SOF11, SOF13-SOF15; T.81 table B.1).
ARITHMETIC_SOF = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
#: PNG samples per pixel by colour type (PNG specification, 11.2.2).
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
#: Adam7 passes: (x0, y0, dx, dy) (PNG specification, 8.2).
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
#: Bytes of inflated PNG data produced at a time while counting (the output is discarded).
INFLATE_CHUNK = 1 << 20
#: TIFF tags: Compression, StripOffsets, StripByteCounts, TileOffsets, TileByteCounts (TIFF 6.0).
TIFF_COMPRESSION, STRIP_OFFSETS, STRIP_BYTE_COUNTS, TILE_OFFSETS, TILE_BYTE_COUNTS = 259, 273, 279, 324, 325


def ends_early(detail: str, what: str = "") -> UnsupportedMedia:
    """The 415 problem of image data that ends early; ``detail`` says where, ``what`` (``"page 3"``)
    which part of the document, when given."""
    return UnsupportedMedia(f"{what + ': ' if what else ''}{TRUNCATED}: {detail}", slug="truncated")


def check_image_data(image: Image.Image, frame: int = 0, what: str = "") -> None:
    """Check that ``image``'s file holds enough data for the frame it declares, before decoding.

    Args:
        image: an image opened by Pillow, at ``frame`` (its ``fp`` is read and put back).
        frame: the frame number (PNG: only the first frame's ``IDAT`` is checked).
        what: which part of the document it is (``"page 3"``), named first in the problem.

    Raises:
        UnsupportedMedia: 415 ``truncated``: a Huffman-coded JPEG with fewer bytes of scan data than
            its blocks need (:data:`MIN_BITS_PER_BLOCK`), a PNG whose ``IDAT`` stream inflates to
            fewer bytes than its rows, a TIFF strip or tile past the end of the file.
    """
    fp = image.fp
    if fp is None:
        return
    where = fp.tell()
    try:
        if image.format in ("JPEG", "MPO") and frame == 0:
            _check_jpeg(image)
        elif image.format == "PNG" and frame == 0:
            _check_png(fp)
        elif image.format == "TIFF":
            _check_tiff(image)
    except UnsupportedMedia as problem:
        if not what:
            raise
        raise UnsupportedMedia(f"{what}: {problem.detail}", slug=problem.slug) from None
    finally:
        fp.seek(where)


def _file_size(fp) -> int:
    fp.seek(0, 2)
    return fp.tell()


def _check_jpeg(image: Image.Image) -> None:
    """Scan data (from the first scan to the end of the file, headers of later scans included:
    an overestimate) against the blocks the frame header declares."""
    if not image.tile or not getattr(image, "layer", None):
        return
    fp = image.fp
    scan_start = image.tile[0][2]
    fp.seek(0)
    header = fp.read(scan_start)
    if _jpeg_sof(header) in ARITHMETIC_SOF:
        return
    width, height = image.size
    h_max = max(h for _, h, _, _ in image.layer)
    v_max = max(v for _, _, v, _ in image.layer)
    blocks = sum(
        math.ceil(math.ceil(width * h / h_max) / 8) * math.ceil(math.ceil(height * v / v_max) / 8)
        for _, h, v, _ in image.layer
    )
    needed = math.ceil(blocks * MIN_BITS_PER_BLOCK / 8)
    coded = _file_size(fp) - scan_start
    if coded < needed:
        raise ends_early(
            f"the JPEG declares {width} x {height} pixels ({blocks:,} blocks of 8 x 8), whose scan "
            f"data takes at least {needed:,} bytes; the file holds {coded:,}"
        )


def _jpeg_sof(header: bytes) -> int | None:
    """The start-of-frame marker (``0xC0``-``0xCF`` but DHT, JPG, DAC) in a JPEG's header, or None."""
    pos = 2
    while pos + 4 <= len(header):
        if header[pos] != 0xFF:
            return None
        marker = header[pos + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker
        if marker == 0xDA:
            return None
        pos += 2 + struct.unpack(">H", header[pos + 2 : pos + 4])[0]
    return None


def _png_row_bytes(width: int, height: int, bits: int) -> int:
    """Bytes of filtered scanlines (one filter byte per row) of a ``width x height`` image."""
    return height * (1 + math.ceil(width * bits / 8)) if width and height else 0


def _check_png(fp) -> None:
    """Inflate the ``IDAT`` stream, counting and discarding its output, against the rows the
    header declares (a corrupt stream is left to the decoder to report)."""
    fp.seek(8)
    head = fp.read(25)
    if len(head) < 25 or head[4:8] != b"IHDR":
        return
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", head[8:21])
    bits = depth * PNG_CHANNELS.get(colour, 4)
    if interlace:
        expected = sum(
            _png_row_bytes(max(0, math.ceil((width - x0) / dx)), max(0, math.ceil((height - y0) / dy)), bits)
            for x0, y0, dx, dy in ADAM7
        )
    else:
        expected = _png_row_bytes(width, height, bits)
    inflater = zlib.decompressobj()
    produced = 0
    fp.seek(8)
    try:
        while produced < expected and not inflater.eof:
            chunk = fp.read(8)
            if len(chunk) < 8:
                break
            length, kind = struct.unpack(">I4s", chunk)
            if kind == b"IEND":
                break
            if kind != b"IDAT":
                fp.seek(length + 4, 1)
                continue
            data = fp.read(length)
            fp.seek(4, 1)  # CRC
            while data and produced < expected and not inflater.eof:
                produced += len(inflater.decompress(data, INFLATE_CHUNK))
                data = inflater.unconsumed_tail
    except zlib.error:
        return
    if produced < expected:
        raise ends_early(
            f"the PNG declares {width} x {height} pixels ({expected:,} bytes of rows); its image data "
            f"holds {produced:,}"
        )


def _check_tiff(image: Image.Image) -> None:
    """Each strip or tile of the current frame within the file; an uncompressed frame's strips
    holding its rows."""
    tags = image.tag_v2
    offsets = tags.get(STRIP_OFFSETS) or tags.get(TILE_OFFSETS)
    counts = tags.get(STRIP_BYTE_COUNTS) or tags.get(TILE_BYTE_COUNTS)
    if not offsets or not counts:
        return
    size = _file_size(image.fp)
    for number, (offset, count) in enumerate(zip(offsets, counts, strict=False)):
        if offset + count > size:
            raise ends_early(
                f"the TIFF's strip {number + 1} of {len(offsets)} runs to byte {offset + count:,}, past "
                f"the end of the file ({size:,} bytes)"
            )


def check_tiff_directory(head: bytes, size: int) -> None:
    """A file that starts as a TIFF but whose first image directory lies past its end (a TIFF
    cut short whose writer put the directory last): 415 ``truncated`` rather than "unknown file".

    Args:
        head: the file's first bytes (at least 8).
        size: the file's length in bytes.
    """
    if head[:4] == b"II*\0":
        offset = struct.unpack("<I", head[4:8])[0]
    elif head[:4] == b"MM\0*":
        offset = struct.unpack(">I", head[4:8])[0]
    else:
        return
    if offset + 2 > size:
        raise ends_early(
            f"the TIFF's first image directory is at byte {offset:,}, past the end of the file ({size:,} bytes)"
        )
