"""Test documents: PDFs made with reportlab (real text a PDF reader extracts) and Markdown."""

from __future__ import annotations

import io
from collections.abc import Sequence

from reportlab.lib.pagesizes import A4
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.cidfonts import UnicodeCIDFont
from reportlab.pdfgen import canvas

# One of the Adobe CJK fonts every PDF reader knows by name: nothing is embedded, and
# the text is stored as Unicode (UniGB-UCS2-H), so it is extractable.
CJK_FONT = "STSong-Light"


def make_pdf(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF with one page per item, each line of it drawn as text."""
    if CJK_FONT not in pdfmetrics.getRegisteredFontNames():
        pdfmetrics.registerFont(UnicodeCIDFont(CJK_FONT))
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=True)
    for lines in pages:
        y = 800
        for line in lines:
            is_cjk = any("\u4e00" <= char <= "\u9fff" for char in line)
            pdf.setFont(CJK_FONT if is_cjk else "Helvetica", 11)
            pdf.drawString(50, y, line)
            y -= 16
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


HANDBOOK_MD = """# Handbook

Welcome to the Acme handbook. It covers travel and equipment.

## Travel

Employees book train travel through the portal called Wayfarer. Flights need approval
from a director.

## Equipment

Every new engineer receives a laptop with 64 GB of memory on the first day.

## 中文说明

公司的年假是每年二十五天，需要提前两周申请。
"""
