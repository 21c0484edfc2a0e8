"""NNC's "format ... tensor into string" cases (test/unit/nnc/tensor.tests.c) on
:func:`fnnc.io.format_tensor`, the port of ``ccv_nnc_tensor_format_new``.

Oracles: NNC's literal strings, copied from its tests; for the branches and datatypes
its tests do not reach, strings printed by NNC's own function (compiled from
lib/nnc/ccv_nnc_tensor.c with a stub tensor) and, per element, Python's ``%`` formatting
with the C format specifiers NNC's ``_strv`` uses (``%10.5g``, ``%10d``, ``%12lld``,
``%3d``), which follows C's ``printf``.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc.errors import DTypeError
from fnnc.io import format_tensor

# -- NNC's literal strings ---------------------------------------------------------------

FIVE_D = (
    "[\n"
    "  [[[[         0,          1,          2,  ...,          6,          7,          8],\n"
    "     [         9,         10,         11,  ...,         15,         16,         17],\n"
    "     [        18,         19,         20,  ...,         24,         25,         26],\n"
    "     ...,\n"
    "     [        54,         55,         56,  ...,         60,         61,         62],\n"
    "     [        63,         64,         65,  ...,         69,         70,         71],\n"
    "     [        72,         73,         74,  ...,         78,         79,         80]],\n"
    "    [[        81,         82,         83,  ...,         87,         88,         89],\n"
    "     [        90,         91,         92,  ...,         96,         97,         98],\n"
    "     [        99,        100,        101,  ...,        105,        106,        107],\n"
    "     ...,\n"
    "     [       135,        136,        137,  ...,        141,        142,        143],\n"
    "     [       144,        145,        146,  ...,        150,        151,        152],\n"
    "     [       153,        154,        155,  ...,        159,        160,        161]]],\n"
    "   [[[       162,        163,        164,  ...,        168,        169,        170],\n"
    "     [       171,        172,        173,  ...,        177,        178,        179],\n"
    "     [       180,        181,        182,  ...,        186,        187,        188],\n"
    "     ...,\n"
    "     [       216,        217,        218,  ...,        222,        223,        224],\n"
    "     [       225,        226,        227,  ...,        231,        232,        233],\n"
    "     [       234,        235,        236,  ...,        240,        241,        242]],\n"
    "    [[       243,        244,        245,  ...,        249,        250,        251],\n"
    "     [       252,        253,        254,  ...,        258,        259,        260],\n"
    "     [       261,        262,        263,  ...,        267,        268,        269],\n"
    "     ...,\n"
    "     [       297,        298,        299,  ...,        303,        304,        305],\n"
    "     [       306,        307,        308,  ...,        312,        313,        314],\n"
    "     [       315,        316,        317,  ...,        321,        322,        323]]],\n"
    "   ...,\n"
    "   [[[       486,        487,        488,  ...,        492,        493,        494],\n"
    "     [       495,        496,        497,  ...,        501,        502,        503],\n"
    "     [       504,        505,        506,  ...,        510,        511,        512],\n"
    "     ...,\n"
    "     [       540,        541,        542,  ...,        546,        547,        548],\n"
    "     [       549,        550,        551,  ...,        555,        556,        557],\n"
    "     [       558,        559,        560,  ...,        564,        565,        566]],\n"
    "    [[       567,        568,        569,  ...,        573,        574,        575],\n"
    "     [       576,        577,        578,  ...,        582,        583,        584],\n"
    "     [       585,        586,        587,  ...,        591,        592,        593],\n"
    "     ...,\n"
    "     [       621,        622,        623,  ...,        627,        628,        629],\n"
    "     [       630,        631,        632,  ...,        636,        637,        638],\n"
    "     [       639,        640,        641,  ...,        645,        646,        647]]],\n"
    "   [[[       648,        649,        650,  ...,        654,        655,        656],\n"
    "     [       657,        658,        659,  ...,        663,        664,        665],\n"
    "     [       666,        667,        668,  ...,        672,        673,        674],\n"
    "     ...,\n"
    "     [       702,        703,        704,  ...,        708,        709,        710],\n"
    "     [       711,        712,        713,  ...,        717,        718,        719],\n"
    "     [       720,        721,        722,  ...,        726,        727,        728]],\n"
    "    [[       729,        730,        731,  ...,        735,        736,        737],\n"
    "     [       738,        739,        740,  ...,        744,        745,        746],\n"
    "     [       747,        748,        749,  ...,        753,        754,        755],\n"
    "     ...,\n"
    "     [       783,        784,        785,  ...,        789,        790,        791],\n"
    "     [       792,        793,        794,  ...,        798,        799,        800],\n"
    "     [       801,        802,        803,  ...,        807,        808,        809]]]],\n"
    "  [[[[       810,        811,        812,  ...,        816,        817,        818],\n"
    "     [       819,        820,        821,  ...,        825,        826,        827],\n"
    "     [       828,        829,        830,  ...,        834,        835,        836],\n"
    "     ...,\n"
    "     [       864,        865,        866,  ...,        870,        871,        872],\n"
    "     [       873,        874,        875,  ...,        879,        880,        881],\n"
    "     [       882,        883,        884,  ...,        888,        889,        890]],\n"
    "    [[       891,        892,        893,  ...,        897,        898,        899],\n"
    "     [       900,        901,        902,  ...,        906,        907,        908],\n"
    "     [       909,        910,        911,  ...,        915,        916,        917],\n"
    "     ...,\n"
    "     [       945,        946,        947,  ...,        951,        952,        953],\n"
    "     [       954,        955,        956,  ...,        960,        961,        962],\n"
    "     [       963,        964,        965,  ...,        969,        970,        971]]],\n"
    "   [[[       972,        973,        974,  ...,        978,        979,        980],\n"
    "     [       981,        982,        983,  ...,        987,        988,        989],\n"
    "     [       990,        991,        992,  ...,        996,        997,        998],\n"
    "     ...,\n"
    "     [      1026,       1027,       1028,  ...,       1032,       1033,       1034],\n"
    "     [      1035,       1036,       1037,  ...,       1041,       1042,       1043],\n"
    "     [      1044,       1045,       1046,  ...,       1050,       1051,       1052]],\n"
    "    [[      1053,       1054,       1055,  ...,       1059,       1060,       1061],\n"
    "     [      1062,       1063,       1064,  ...,       1068,       1069,       1070],\n"
    "     [      1071,       1072,       1073,  ...,       1077,       1078,       1079],\n"
    "     ...,\n"
    "     [      1107,       1108,       1109,  ...,       1113,       1114,       1115],\n"
    "     [      1116,       1117,       1118,  ...,       1122,       1123,       1124],\n"
    "     [      1125,       1126,       1127,  ...,       1131,       1132,       1133]]],\n"
    "   ...,\n"
    "   [[[      1296,       1297,       1298,  ...,       1302,       1303,       1304],\n"
    "     [      1305,       1306,       1307,  ...,       1311,       1312,       1313],\n"
    "     [      1314,       1315,       1316,  ...,       1320,       1321,       1322],\n"
    "     ...,\n"
    "     [      1350,       1351,       1352,  ...,       1356,       1357,       1358],\n"
    "     [      1359,       1360,       1361,  ...,       1365,       1366,       1367],\n"
    "     [      1368,       1369,       1370,  ...,       1374,       1375,       1376]],\n"
    "    [[      1377,       1378,       1379,  ...,       1383,       1384,       1385],\n"
    "     [      1386,       1387,       1388,  ...,       1392,       1393,       1394],\n"
    "     [      1395,       1396,       1397,  ...,       1401,       1402,       1403],\n"
    "     ...,\n"
    "     [      1431,       1432,       1433,  ...,       1437,       1438,       1439],\n"
    "     [      1440,       1441,       1442,  ...,       1446,       1447,       1448],\n"
    "     [      1449,       1450,       1451,  ...,       1455,       1456,       1457]]],\n"
    "   [[[      1458,       1459,       1460,  ...,       1464,       1465,       1466],\n"
    "     [      1467,       1468,       1469,  ...,       1473,       1474,       1475],\n"
    "     [      1476,       1477,       1478,  ...,       1482,       1483,       1484],\n"
    "     ...,\n"
    "     [      1512,       1513,       1514,  ...,       1518,       1519,       1520],\n"
    "     [      1521,       1522,       1523,  ...,       1527,       1528,       1529],\n"
    "     [      1530,       1531,       1532,  ...,       1536,       1537,       1538]],\n"
    "    [[      1539,       1540,       1541,  ...,       1545,       1546,       1547],\n"
    "     [      1548,       1549,       1550,  ...,       1554,       1555,       1556],\n"
    "     [      1557,       1558,       1559,  ...,       1563,       1564,       1565],\n"
    "     ...,\n"
    "     [      1593,       1594,       1595,  ...,       1599,       1600,       1601],\n"
    "     [      1602,       1603,       1604,  ...,       1608,       1609,       1610],\n"
    "     [      1611,       1612,       1613,  ...,       1617,       1618,       1619]]]]\n"
    "]"
)

SMALL_2D = (
    "[\n"
    "  [         0,          1,          2,          3],\n"
    "  [         4,          5,          6,          7],\n"
    "  [         8,          9,         10,         11],\n"
    "  [        12,         13,         14,         15]\n"
    "]"
)

SMALL_1D = (
    "[\n"
    "           0,          1,          2,          3,          4,          5,          6,          7,\n"  # noqa: E501
    "           8,          9,         10,         11\n"
    "]"
)

LARGE_1D = (
    "[\n"
    "           0,          1,          2,          3,          4,          5,          6,          7,\n"  # noqa: E501
    "           8,          9,         10,         11,         12,         13,         14,         15,\n"  # noqa: E501
    "          16,         17,         18,         19,         20,         21,         22,         23,\n"  # noqa: E501
    "  ...,\n"
    "          48,         49,         50,         51,         52,         53,         54,         55,\n"  # noqa: E501
    "          56,         57,         58,         59,         60,         61,         62,         63,\n"  # noqa: E501
    "          64,         65,         66,         67\n"
    "]"
)


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        ((2, 5, 2, 9, 9), FIVE_D),
        ((4, 4), SMALL_2D),
        ((12,), SMALL_1D),
        ((68,), LARGE_1D),
    ],
    ids=["format 5-d", "format small 2-d", "format small 1-d", "format large 1-d"],
)
def test_nnc_format_cases(shape, want):
    """NNC fills a 32S tensor with 0, 1, 2, ... and compares the string byte for byte.

    NNC TEST_CASEs covered here:
    "format 5-d tensor into string",
    "format small 2-d tensor into string",
    "format small 1-d tensor into string",
    "format large 1-d tensor into string".
    """
    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    assert format_tensor(x) == want
    assert format_tensor(jnp.asarray(x)) == want


# -- branches NNC's tests do not reach (strings from NNC's function itself) --------------


def test_matrix_past_8_rows_cuts_its_last_rows_from_8_columns_on():
    """Past 8 rows NNC tests ``dim[1] < 8`` for the last 3 rows: 8 columns are cut there
    but not in the first 3 rows."""
    want = (
        "[\n"
        "  [         0,          1,          2,          3,          4,          5,          6,          7],\n"  # noqa: E501
        "  [         8,          9,         10,         11,         12,         13,         14,         15],\n"  # noqa: E501
        "  [        16,         17,         18,         19,         20,         21,         22,         23],\n"  # noqa: E501
        "  ...,\n"
        "  [        48,         49,         50,  ...,         53,         54,         55],\n"
        "  [        56,         57,         58,  ...,         61,         62,         63],\n"
        "  [        64,         65,         66,  ...,         69,         70,         71]\n"
        "]"
    )
    assert format_tensor(np.arange(72, dtype=np.int32).reshape(9, 8)) == want


def test_vector_past_64_ends_with_its_last_3_lines_aligned_to_8():
    want = (
        "[\n"
        "           0,          1,          2,          3,          4,          5,          6,          7,\n"  # noqa: E501
        "           8,          9,         10,         11,         12,         13,         14,         15,\n"  # noqa: E501
        "          16,         17,         18,         19,         20,         21,         22,         23,\n"  # noqa: E501
        "  ...,\n"
        "          48,         49,         50,         51,         52,         53,         54,         55,\n"  # noqa: E501
        "          56,         57,         58,         59,         60,         61,         62,         63,\n"  # noqa: E501
        "          64\n"
        "]"
    )
    assert format_tensor(np.arange(65, dtype=np.int32)) == want


# -- per-datatype numbers ----------------------------------------------------------------


def _fields(values, spec):
    return [spec % v for v in values]


def test_float32_prints_each_element_as_percent_10_5g():
    x = np.array([[0.5, -1.25, 3.14159265], [1e-7, 123456.7, -0.0]], np.float32)
    want = "[\n  [       0.5,      -1.25,     3.1416],\n  [     1e-07, 1.2346e+05,         -0]\n]"
    rows = [", ".join(_fields(map(float, row), "%10.5g")) for row in x]
    assert want == "[\n  [" + "],\n  [".join(rows) + "]\n]"
    assert format_tensor(x) == want


def test_float16_and_float64_print_their_values_as_percent_10_5g():
    half = np.array([1 / 3, 65504, 6e-8, -2.5, np.inf], np.float16)
    want = "[\n     0.33325,      65504, 5.9605e-08,       -2.5,        inf\n]"
    assert want == "[\n  " + ", ".join(_fields(map(float, half), "%10.5g")) + "\n]"
    assert format_tensor(half) == want
    double = np.array([1e100, -1e-300, np.nan])
    assert format_tensor(double) == "[\n      1e+100,    -1e-300,        nan\n]"


def test_bfloat16_prints_like_float16():
    """fnnc's extension: NNC's printer has no 16BF case; fnnc prints its value."""
    x = np.array([1 / 3, -2.0], ml_dtypes.bfloat16)
    want = "[\n     0.33398,         -2\n]"
    assert want == "[\n  " + ", ".join(_fields(map(float, x), "%10.5g")) + "\n]"
    assert format_tensor(x) == want
    assert format_tensor(jnp.asarray(x)) == want


def test_integer_widths_follow_nnc_specifiers():
    assert format_tensor(np.array([0, 7, 255], np.uint8)) == "[\n    0,   7, 255\n]"
    big = np.array([-(2**40), 3], np.int64)
    assert format_tensor(big) == "[\n  " + ", ".join(_fields(map(int, big), "%12d")) + "\n]"
    assert format_tensor(big) == "[\n  -1099511627776,            3\n]"


# -- edge cases and mistakes -------------------------------------------------------------


def test_scalar_prints_as_a_one_element_vector():
    assert format_tensor(np.float32(2.5)) == "[\n         2.5\n]"
    assert format_tensor(jnp.int32(-4)) == "[\n          -4\n]"


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 4)])
def test_empty_array_prints_no_elements(shape):
    assert format_tensor(np.zeros(shape, np.float32)) == "[\n  \n]"


@pytest.mark.parametrize(
    "value",
    [np.array([True, False]), np.zeros(2, np.int8), np.zeros(2, np.complex64), None, "ab"],
    ids=["bool", "int8", "complex64", "None", "str"],
)
def test_dtype_nnc_lacks_is_a_clear_error(value):
    dtype = np.asarray(value).dtype
    with pytest.raises(DTypeError, match=f"NNC's datatypes.*got dtype {dtype}.*astype"):
        format_tensor(value)
