"""Measurement units written after numbers, with how each language reads them.

One table serves two jobs: language detection treats `5km` as one neutral token (so the unit stays
with the number's language run), and each language's normalizer reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    en_one: str
    en_many: str
    zh: str
    """`{}` stands for the number, so units read before it work too (华氏{}度)."""
    ja: str


def _u(en_one: str, en_many: str, zh: str, ja: str) -> Unit:
    return Unit(en_one, en_many, zh if "{}" in zh else "{}" + zh, ja if "{}" in ja else "{}" + ja)


UNITS: dict[str, Unit] = {
    "km/h": _u("kilometer per hour", "kilometers per hour", "千米每小时", "キロメートル毎時"),
    "kph": _u("kilometer per hour", "kilometers per hour", "千米每小时", "キロメートル毎時"),
    "mph": _u("mile per hour", "miles per hour", "英里每小时", "マイル毎時"),
    "km": _u("kilometer", "kilometers", "千米", "キロメートル"),
    "cm": _u("centimeter", "centimeters", "厘米", "センチメートル"),
    "mm": _u("millimeter", "millimeters", "毫米", "ミリメートル"),
    "m": _u("meter", "meters", "米", "メートル"),
    "kg": _u("kilogram", "kilograms", "千克", "キログラム"),
    "mg": _u("milligram", "milligrams", "毫克", "ミリグラム"),
    "g": _u("gram", "grams", "克", "グラム"),
    "ml": _u("milliliter", "milliliters", "毫升", "ミリリットル"),
    "mL": _u("milliliter", "milliliters", "毫升", "ミリリットル"),
    "L": _u("liter", "liters", "升", "リットル"),
    "lb": _u("pound", "pounds", "磅", "ポンド"),
    "lbs": _u("pound", "pounds", "磅", "ポンド"),
    "oz": _u("ounce", "ounces", "盎司", "オンス"),
    "ft": _u("foot", "feet", "英尺", "フィート"),
    "ms": _u("millisecond", "milliseconds", "毫秒", "ミリ秒"),
    "°C": _u("degree Celsius", "degrees Celsius", "{}摄氏度", "{}度"),
    "℃": _u("degree Celsius", "degrees Celsius", "{}摄氏度", "{}度"),
    "°F": _u("degree Fahrenheit", "degrees Fahrenheit", "华氏{}度", "華氏{}度"),
    "℉": _u("degree Fahrenheit", "degrees Fahrenheit", "华氏{}度", "華氏{}度"),
    "KB": _u("kilobyte", "kilobytes", "千字节", "キロバイト"),
    "MB": _u("megabyte", "megabytes", "兆字节", "メガバイト"),
    "GB": _u("gigabyte", "gigabytes", "吉字节", "ギガバイト"),
    "TB": _u("terabyte", "terabytes", "太字节", "テラバイト"),
    "Hz": _u("hertz", "hertz", "赫兹", "ヘルツ"),
    "kHz": _u("kilohertz", "kilohertz", "千赫", "キロヘルツ"),
    "MHz": _u("megahertz", "megahertz", "兆赫", "メガヘルツ"),
    "GHz": _u("gigahertz", "gigahertz", "吉赫", "ギガヘルツ"),
    # Read by hibari's own normalizer before it read English through this table.
    "mi": _u("mile", "miles", "英里", "マイル"),
    "yd": _u("yard", "yards", "码", "ヤード"),
    "nm": _u("nanometer", "nanometers", "纳米", "ナノメートル"),
    "µm": _u("micrometer", "micrometers", "微米", "マイクロメートル"),
    "mcg": _u("microgram", "micrograms", "微克", "マイクログラム"),
    "µg": _u("microgram", "micrograms", "微克", "マイクログラム"),
    "cc": _u("cubic centimeter", "cubic centimeters", "立方厘米", "シーシー"),
    "sq ft": _u("square foot", "square feet", "平方英尺", "平方フィート"),
    "sq mi": _u("square mile", "square miles", "平方英里", "平方マイル"),
    "hr": _u("hour", "hours", "小时", "時間"),
    "hrs": _u("hour", "hours", "小时", "時間"),
    "min": _u("minute", "minutes", "分钟", "分"),
    "mins": _u("minute", "minutes", "分钟", "分"),
    "sec": _u("second", "seconds", "秒", "秒"),
    "secs": _u("second", "seconds", "秒", "秒"),
    "kB": _u("kilobyte", "kilobytes", "千字节", "キロバイト"),
    "Mbps": _u("megabit per second", "megabits per second", "兆比特每秒", "メガビット毎秒"),
    "Gbps": _u("gigabit per second", "gigabits per second", "吉比特每秒", "ギガビット毎秒"),
    "kW": _u("kilowatt", "kilowatts", "千瓦", "キロワット"),
    "kWh": _u("kilowatt hour", "kilowatt hours", "千瓦时", "キロワット時"),
    "MW": _u("megawatt", "megawatts", "兆瓦", "メガワット"),
    "GW": _u("gigawatt", "gigawatts", "吉瓦", "ギガワット"),
    "mAh": _u("milliamp hour", "milliamp hours", "毫安时", "ミリアンペア時"),
    "fps": _u("frame per second", "frames per second", "帧每秒", "フレーム毎秒"),
    "pct": _u("percent", "percent", "百分之{}", "{}パーセント"),
}

NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
"""A written number: digits, optional thousands commas, optional decimals."""

_SYMBOLS = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
UNIT_AFTER_NUMBER = re.compile(rf"(?P<number>{NUMBER})\s?(?P<unit>{_SYMBOLS})(?![A-Za-z])")
"""A number followed by a unit symbol (`5km`, `20 °C`); the unit is not part of a longer word."""
