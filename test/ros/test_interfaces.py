"""
The project's own interfaces (oxygen_ros_interfaces): generated types, and bags that hold them.

``make setup`` generates the package with rosidl into the venv (``colcon build`` in a ROS 2
workspace, test_colcon). Here: the generated Python types import and serialize, their type
hashes are those rosbags computes from the installed ``.msg`` files, and a bag with
``DecodedText`` messages round-trips through ``rosbags`` (both storages).
"""

import json
from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from lxml import etree
from oxygen_ros.tools.bag.topics import (
    check_known_type, own_message_definitions, Storage, typestore)
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.rosbag2 import Reader, Writer

DECODED_TEXT = 'oxygen_ros_interfaces/msg/DecodedText'
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.linter
def test_interface_package_xml_is_valid_format3():
    schema = etree.XMLSchema(etree.parse(str(ROOT / 'test' / 'package_format3.xsd')))
    tree = etree.parse(str(ROOT / 'oxygen_ros_interfaces' / 'package.xml'))
    assert schema.validate(tree), schema.error_log
    assert tree.findtext('name') == 'oxygen_ros_interfaces'
    assert tree.findtext('export/build_type') == 'ament_cmake'
    assert tree.findtext('member_of_group') == 'rosidl_interface_packages'
    root = etree.parse(str(ROOT / 'package.xml'))
    assert 'oxygen_ros_interfaces' in [e.text for e in root.iterfind('exec_depend')]


def test_generated_types_import_with_their_constants():
    assert (DecodedText.TASK_ANSWER, DecodedText.TASK_SUBTASK, DecodedText.TASK_MEMORY) == \
        (1, 2, 3)
    assert (Ask.Result.STATUS_EOS, Ask.Result.STATUS_LENGTH, Ask.Result.STATUS_CANCELED,
            Ask.Result.STATUS_DROPPED) == (1, 2, 3, 4)
    fields = DecodedText.get_fields_and_field_types()
    assert fields == {'header': 'std_msgs/Header', 'request_id': 'string', 'task': 'uint8',
                      'text': 'string', 'is_final': 'boolean', 'num_tokens': 'uint32',
                      'time_from_request': 'builtin_interfaces/Duration'}
    assert Ask.Goal.get_fields_and_field_types() == {'question': 'string',
                                                     'max_tokens': 'uint32'}
    assert Ask.Feedback.get_fields_and_field_types() == {
        'piece': 'oxygen_ros_interfaces/DecodedText', 'text_so_far': 'string'}
    assert Ask.Result.get_fields_and_field_types() == {
        'answer': 'oxygen_ros_interfaces/DecodedText', 'status': 'uint8', 'reason': 'string'}
    msg = DecodedText(request_id='answer-3', task=DecodedText.TASK_ANSWER, text='€ à 😀',
                      is_final=True, num_tokens=7)
    assert deserialize_message(serialize_message(msg), DecodedText) == msg


def test_rosbags_knows_the_installed_definitions():
    share = Path(get_package_share_directory('oxygen_ros_interfaces'))
    assert set(own_message_definitions()) == {DECODED_TEXT}
    installed = json.loads((share / 'msg' / 'DecodedText.json').read_text())
    assert typestore().hash_rihs01(DECODED_TEXT) == \
        installed['type_hashes'][0]['hash_string']
    check_known_type(DECODED_TEXT)
    with pytest.raises(ValueError, match='nor in oxygen_ros_interfaces'):
        check_known_type('oxygen_ros_interfaces/msg/Nope')


@pytest.mark.parametrize('storage', list(Storage))
def test_a_bag_of_decoded_text_round_trips(tmp_path, storage):
    pieces = []
    for i, text in enumerate([' the', ' red', ' cup€', '']):
        msg = DecodedText(request_id='answer-1', task=DecodedText.TASK_ANSWER, text=text,
                          is_final=text == '', num_tokens=i + 1)
        msg.header.stamp.sec, msg.header.frame_id = 1_700_000_000, 'base_link'
        msg.time_from_request.nanosec = 100_000_000 * (i + 1)
        pieces.append(msg)
    bag = tmp_path / 'bag'
    with Writer(bag, version=Writer.VERSION_LATEST, storage_plugin=storage.plugin) as writer:
        conn = writer.add_connection('/oxygen/answer/stream', DECODED_TEXT,
                                     typestore=typestore())
        for i, msg in enumerate(pieces):
            writer.write(conn, 1_700_000_000 * 10**9 + i, serialize_message(msg))
    with Reader(bag) as reader:
        [conn] = reader.connections
        assert (conn.msgtype, conn.msgcount) == (DECODED_TEXT, 4)
        raws = [bytes(raw) for _, _, raw in reader.messages()]
    assert [deserialize_message(raw, DecodedText) for raw in raws] == pieces
    decoded = [typestore().deserialize_cdr(raw, DECODED_TEXT) for raw in raws]
    assert [(d.text, d.is_final, d.num_tokens, d.header.frame_id,
             d.time_from_request.nanosec) for d in decoded] == \
        [(m.text, m.is_final, m.num_tokens, m.header.frame_id, m.time_from_request.nanosec)
         for m in pieces]
