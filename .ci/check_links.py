#!/usr/bin/env python3
"""Every internal link of the built guide leads somewhere: a relative href names a file of
the book and, with `#anchor`, an id on that page. mdBook does not check this itself.
A link to an .md file left unconverted (a page missing from SUMMARY.md, or a path outside
docs/) shows up here as a missing file.

    python3 .ci/check_links.py target/book
"""
import html.parser
import os
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()
        self.links = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for attr in ("href", "src"):
            if attrs.get(attr) is not None and tag in ("a", "img"):
                self.links.append(attrs[attr])


def main(root):
    pages = {}
    # Only the pages built from docs/*.md: mdBook's own (print.html, 404.html, toc.html)
    # repeat them or are generated.
    skip = {"print.html", "404.html", "toc.html"}
    for name in sorted(os.listdir(root)):
        if name.endswith(".html"):
            page = Page()
            with open(os.path.join(root, name), encoding="utf-8") as f:
                page.feed(f.read())
            pages[name] = page
    broken = []
    checked = 0
    for name, page in pages.items():
        if name in skip:
            continue
        for link in page.links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith("//") or link.startswith("mailto:"):
                continue
            target = name if not url.path else os.path.normpath(url.path)
            checked += 1
            if target.endswith(".md"):
                broken.append(f"{name}: {link} (an .md link mdBook did not convert)")
                continue
            if not os.path.exists(os.path.join(root, target)):
                broken.append(f"{name}: {link} (no file {target})")
                continue
            if url.fragment and target.endswith(".html"):
                ids = pages[target].ids if target in pages else set()
                if urllib.parse.unquote(url.fragment) not in ids:
                    broken.append(f"{name}: {link} (no #{url.fragment} in {target})")
    for b in broken:
        print("broken link:", b)
    print(f"check_links: {checked} internal links in {len(pages) - len(skip & set(pages))} pages, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "target/book"))
