"""Language codes: the pair a translator translates, by which `serve`
routes a request, and the names its `/languages` gives them."""

import os
import re

# ISO 639 codes with an optional region or script: "en", "pt-BR", "zh-Hans", "ast".
CODE = re.compile(r"^[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*$")

# The names of the languages that published translators of this
# architecture cover most often; any other code is named by itself.
NAMES = {
    "af": "Afrikaans", "ar": "Arabic", "az": "Azerbaijani", "be": "Belarusian", "bg": "Bulgarian",
    "bn": "Bengali", "ca": "Catalan", "cs": "Czech", "cy": "Welsh", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian",
    "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish", "gl": "Galician",
    "gu": "Gujarati", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian",
    "hy": "Armenian", "id": "Indonesian", "is": "Icelandic", "it": "Italian", "ja": "Japanese",
    "ka": "Georgian", "kk": "Kazakh", "km": "Khmer", "kn": "Kannada", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "mk": "Macedonian", "ml": "Malayalam", "mn": "Mongolian", "mr": "Marathi",
    "ms": "Malay", "mt": "Maltese", "my": "Burmese", "nb": "Norwegian Bokmal", "ne": "Nepali",
    "nl": "Dutch", "no": "Norwegian", "pa": "Punjabi", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "si": "Sinhala", "sk": "Slovak", "sl": "Slovenian",
    "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "sw": "Swahili", "ta": "Tamil",
    "te": "Telugu", "th": "Thai", "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu",
    "uz": "Uzbek", "vi": "Vietnamese", "xh": "Xhosa", "zh": "Chinese", "zu": "Zulu",
}


def check_code(code, what="a language"):
    """`code` if it is a language code; a ValueError that says what was
    received otherwise."""
    if not isinstance(code, str) or not CODE.match(code):
        raise ValueError(f"{what} must be a language code such as 'en', 'de' or 'pt-BR'. Received: {code!r}")
    return code


def check_pair(languages):
    """None, or `(source, target)` codes as a tuple."""
    if languages is None:
        return None
    if isinstance(languages, str) or not isinstance(languages, (list, tuple)) or len(languages) != 2:
        raise ValueError(
            "languages must be a (source, target) pair of language codes, such as ('en', 'de'), "
            f"or None. Received: languages={languages!r}"
        )
    return check_code(languages[0], "The source language"), check_code(languages[1], "The target language")


def parse_pair(text):
    """`("en", "de")` from "en-de" or "en:de" (a pair given on a command
    line; ':' where a code has a region, as in "en:pt-BR")."""
    source, separator, target = text.partition(":" if ":" in text else "-")
    if not separator:
        raise ValueError(f"A language pair is two codes such as en-de (or en:pt-BR). Received: {text!r}")
    return check_pair((source, target))


def pair_or_none(source, target):
    """The pair a checkpoint names, or None where it names none or names
    something other than two language codes (a group such as "ROMANCE")."""
    try:
        return check_pair((source, target))
    except ValueError:
        return None


def language_of_file(path):
    """The language a corpus file's suffix names ("en" for `train.en` or
    `train.en.gz`), or None where the suffix is no known language code."""
    name = os.path.basename(os.fspath(path))
    name = name[:-3] if name.endswith(".gz") else name
    stem, dot, suffix = name.rpartition(".")
    # Known codes only: a suffix such as ".txt" must not pass for a language.
    return suffix if dot and stem and suffix in NAMES else None


def name_of(code):
    """"German" for "de" or "de-AT"; the code itself where it is not in `NAMES`."""
    return NAMES.get(re.split(r"[-_]", code)[0], code)
